// Solves the server's ALTCHA challenge (GET /api/v1/challenge, classic format) for the create
// form: find number <= maxnumber with SHA-256(salt + number) == challenge, then put the base64
// JSON payload into the form's `altcha` field. Plain JS SHA-256, so it also works where
// crypto.subtle is missing (plain HTTP).
"use strict";
(() => {
  const K = new Uint32Array([
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
  ]);
  const W = new Uint32Array(64);

  // SHA-256 of an ASCII string, as hex.
  function sha256(text) {
    const n = text.length;
    const blocks = ((n + 9 + 63) >> 6) << 4;
    const words = new Uint32Array(blocks);
    for (let i = 0; i < n; i++) words[i >> 2] |= text.charCodeAt(i) << (24 - (i & 3) * 8);
    words[n >> 2] |= 0x80 << (24 - (n & 3) * 8);
    words[blocks - 1] = n * 8;
    let h0 = 0x6a09e667, h1 = 0xbb67ae85, h2 = 0x3c6ef372, h3 = 0xa54ff53a;
    let h4 = 0x510e527f, h5 = 0x9b05688c, h6 = 0x1f83d9ab, h7 = 0x5be0cd19;
    const rotr = (x, r) => (x >>> r) | (x << (32 - r));
    for (let b = 0; b < blocks; b += 16) {
      for (let t = 0; t < 64; t++) {
        if (t < 16) W[t] = words[b + t];
        else {
          const s0 = rotr(W[t - 15], 7) ^ rotr(W[t - 15], 18) ^ (W[t - 15] >>> 3);
          const s1 = rotr(W[t - 2], 17) ^ rotr(W[t - 2], 19) ^ (W[t - 2] >>> 10);
          W[t] = W[t - 16] + s0 + W[t - 7] + s1;
        }
      }
      let a = h0, bb = h1, c = h2, d = h3, e = h4, f = h5, g = h6, h = h7;
      for (let t = 0; t < 64; t++) {
        const S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
        const t1 = (h + S1 + ((e & f) ^ (~e & g)) + K[t] + W[t]) | 0;
        const S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
        const t2 = (S0 + ((a & bb) ^ (a & c) ^ (bb & c))) | 0;
        h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = bb; bb = a; a = (t1 + t2) | 0;
      }
      h0 = (h0 + a) | 0; h1 = (h1 + bb) | 0; h2 = (h2 + c) | 0; h3 = (h3 + d) | 0;
      h4 = (h4 + e) | 0; h5 = (h5 + f) | 0; h6 = (h6 + g) | 0; h7 = (h7 + h) | 0;
    }
    return [h0, h1, h2, h3, h4, h5, h6, h7]
      .map((x) => (x >>> 0).toString(16).padStart(8, "0")).join("");
  }

  async function solve(box) {
    const field = box.querySelector("input[name=altcha]");
    const status = box.querySelector(".captcha-status");
    status.textContent = "Checking that you are a person…";
    const response = await fetch(box.dataset.captcha, { credentials: "same-origin" });
    if (!response.ok) throw new Error(`challenge: HTTP ${response.status}`);
    const c = await response.json();
    for (let number = 0; number <= c.maxnumber; number++) {
      if (sha256(c.salt + number) === c.challenge) {
        field.value = btoa(JSON.stringify({
          algorithm: c.algorithm, challenge: c.challenge, number, salt: c.salt, signature: c.signature,
        }));
        box.dataset.solved = "1";
        status.textContent = "Done: you can create the link.";
        return;
      }
      // Let the page breathe every few thousand tries.
      if (number % 5000 === 4999) await new Promise((r) => setTimeout(r, 0));
    }
    throw new Error("no solution found");
  }

  document.addEventListener("DOMContentLoaded", () => {
    for (const box of document.querySelectorAll("[data-captcha]")) {
      solve(box).catch((e) => {
        box.querySelector(".captcha-status").textContent = `The person check failed (${e.message}); reload the page.`;
      });
    }
  });
})();
