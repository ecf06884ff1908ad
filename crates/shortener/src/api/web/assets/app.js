// Copy buttons: shown only when this script runs (without it the short URL is there to select).
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("button[data-copy]")) {
    button.hidden = false;
    const label = button.firstChild.textContent;
    button.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(button.dataset.copy);
        button.firstChild.textContent = "Copied";
      } catch {
        button.firstChild.textContent = "Select and copy";
      }
      setTimeout(() => { button.firstChild.textContent = label; }, 2000);
    });
  }
});
