"""Every metric an alert rule reads is exported under that name: starts `shortener serve` and
`proxypool serve` on loopback, scrapes both /metrics, and checks each `shortener_*` and
`proxypool_*` name in the rule files against the samples scraped.

Usage: python3 metrics_exist.py SHORTENER_BIN PROXYPOOL_BIN
"""

import pathlib
import re
import subprocess
import sys
import tempfile
import urllib.request

RULES = pathlib.Path(__file__).resolve().parents[1]
START_TIMEOUT = 30


def start(argv, marker):
    """Runs a server; returns it and the URL after `marker` in its first lines of output."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in process.stdout:
        if marker in line:
            return process, line.split(marker, 1)[1].strip()
    sys.exit(f"{argv[0]} exited before printing {marker!r}")


def scraped_names(url):
    with urllib.request.urlopen(f"{url}/metrics", timeout=START_TIMEOUT) as r:
        text = r.read().decode()
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def rule_names(product):
    text = (RULES / f"{product}.rules.yml").read_text()
    return set(re.findall(rf"\b{product}_[a-z0-9_]+", text))


def main():
    shortener_bin, proxypool_bin = sys.argv[1:3]
    with tempfile.TemporaryDirectory() as tmp:
        upstreams = pathlib.Path(tmp, "upstreams.txt")
        upstreams.write_text("http://127.0.0.1:9\nhttp://127.0.0.2:9\n")
        servers = []
        try:
            shortener, s_url = start(
                [shortener_bin, "serve", "--listen", "127.0.0.1:0", "--data-dir", tmp],
                "listening on ",
            )
            servers.append(shortener)
            proxypool, p_url = start(
                [proxypool_bin, "serve", "--upstreams", str(upstreams),
                 "--proxy-listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0"],
                "api listening on ",
            )
            servers.append(proxypool)
            missing = []
            for product, url in (("shortener", s_url), ("proxypool", p_url)):
                exported = scraped_names(url)
                wanted = rule_names(product)
                if not wanted:
                    sys.exit(f"no {product}_* metric found in {product}.rules.yml")
                missing += sorted(f"{product}: {n}" for n in wanted - exported)
                print(f"{product}: {len(wanted)} metrics used by alerts, all exported"
                      if not wanted - exported else f"{product}: missing {wanted - exported}")
        finally:
            for s in servers:
                s.terminate()
                s.wait(10)
    if missing:
        sys.exit("metrics the alerts use but the services do not export:\n  " + "\n  ".join(missing))


if __name__ == "__main__":
    main()
