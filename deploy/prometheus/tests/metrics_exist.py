"""Every metric an alert rule or a Grafana dashboard reads is exported under that name: starts
`shortener serve` and `proxypool serve` on loopback, sends each a request or two (metrics that
appear on first use: gateway traffic, link creates), scrapes both /metrics, and checks each
`shortener_*` and `proxypool_*` name in the rule files (deploy/prometheus/) and the dashboards
(deploy/grafana/) against the samples scraped. For the dashboards also: every label matcher
(`outcome="error"`) matches a scraped sample of its metric, every `by (label)` is a label of a
metric of its query, and every query is valid PromQL (`promtool check rules` on a rule file made
of them). The proxypool checks run twice: on the in-memory pool and on a pool in Redis
(`--redis`, a redis-server of its own on loopback), the store of scale-out.

Usage: python3 metrics_exist.py SHORTENER_BIN PROXYPOOL_BIN
"""

import json
import pathlib
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

DEPLOY = pathlib.Path(__file__).resolve().parents[2]
START_TIMEOUT = 30
PRODUCTS = ("shortener", "proxypool")
# Grafana's variables, as a Prometheus query would see them once Grafana expanded them.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$instance": ".*"}


def start(argv, markers):
    """Runs a server; returns it and, per marker, what follows it in its first lines of output."""
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    found = {}
    for line in process.stdout:
        for marker in markers:
            if marker in line:
                found[marker] = line.split(marker, 1)[1].strip()
        if len(found) == len(markers):
            return process, found
    sys.exit(f"{argv[0]} exited before printing {markers!r}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(tmp):
    """A throwaway redis-server on loopback (no persistence); returns it and its URL."""
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", tmp],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    for _ in range(START_TIMEOUT * 10):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    return process, f"redis://127.0.0.1:{port}"
        except OSError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.1)
    process.kill()
    sys.exit("redis-server did not answer PING")


def request(url, data=None, proxy=None):
    """One request whose answer does not matter, only that the server counted it."""
    handlers = [urllib.request.ProxyHandler({"http": proxy} if proxy else {})]
    opener = urllib.request.build_opener(*handlers)
    headers = {"content-type": "application/json"} if data else {}
    try:
        opener.open(urllib.request.Request(url, data=data, headers=headers), timeout=START_TIMEOUT)
    except urllib.error.HTTPError:
        pass


def scrape(url):
    """{metric name: [labels of each sample]} from the Prometheus text at url/metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=START_TIMEOUT) as r:
        text = r.read().decode()
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        label_text = line[len(name):].split("}", 1)[0] if line[len(name):].startswith("{") else ""
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', label_text))
        samples.setdefault(name, []).append(labels)
    return samples


def rule_names(product):
    text = (DEPLOY / "prometheus" / f"{product}.rules.yml").read_text()
    return set(re.findall(rf"\b{product}_[a-z0-9_]+", text))


def dashboard_queries(product):
    """Every PromQL query of deploy/grafana/PRODUCT.json (panels and variables), variables
    expanded; structural mistakes (a panel without a query, ids twice) end the run."""
    path = DEPLOY / "grafana" / f"{product}.json"
    board = json.loads(path.read_text())
    queries, ids = [], set()
    for panel in board["panels"]:
        if panel["id"] in ids:
            sys.exit(f"{path}: panel id {panel['id']} twice")
        ids.add(panel["id"])
        if panel["type"] == "row":
            continue
        targets = panel.get("targets") or sys.exit(f"{path}: panel {panel['title']!r} has no query")
        queries += [t["expr"] for t in targets]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            queries.append(variable["query"]["query"])
    expanded = []
    for q in queries:
        for variable, value in GRAFANA_VARIABLES.items():
            q = q.replace(variable, value)
        if "$" in q:
            sys.exit(f"{path}: a variable the check does not know in {q}")
        expanded.append(q)
    return expanded


def check_promql(queries):
    """promtool parses each query (as a recording rule); label_values() is Grafana's, not PromQL."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": q}
        for i, q in enumerate(queries)
        if not q.startswith("label_values(")
    ]
    with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
        json.dump({"groups": [{"name": "dashboards", "rules": rules}]}, f)
        f.flush()
        out = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"a dashboard query is not valid PromQL:\n{out.stdout}{out.stderr}")


def dashboard_problems(product, queries, samples):
    problems = []
    for q in queries:
        names = set(re.findall(rf"\b{product}_[a-z0-9_]+", q))
        problems += [f"{n} (in {q})" for n in sorted(names - samples.keys())]
        for name, matchers in re.findall(rf"\b({product}_[a-z0-9_]+)\{{([^}}]*)\}}", q):
            for label, op, value in re.findall(r'(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"', matchers):
                if label == "instance" or op not in ("=", "=~"):
                    continue  # the scrape target's label; negative matchers match by absence
                pattern = re.compile(value if op == "=~" else re.escape(value))
                if not any(pattern.fullmatch(s.get(label, "")) for s in samples.get(name, [])):
                    problems.append(f'no sample of {name} with {label}{op}"{value}" (in {q})')
        for group in re.findall(r"\bby\s*\(([^)]*)\)", q):
            for label in (l.strip() for l in group.split(",")):
                if not any(label in s for n in names for s in samples.get(n, [])):
                    problems.append(f"no metric of {q} has the label {label!r}")
    return problems


def main():
    shortener_bin, proxypool_bin = sys.argv[1:3]
    with tempfile.TemporaryDirectory() as tmp:
        upstreams = pathlib.Path(tmp, "upstreams.txt")
        upstreams.write_text("http://127.0.0.1:9\nhttp://127.0.0.2:9\n")
        servers = []
        try:
            shortener, s = start(
                [shortener_bin, "serve", "--listen", "127.0.0.1:0", "--data-dir", tmp],
                ["listening on "],
            )
            servers.append(shortener)
            s_url = s["listening on "]
            redis, redis_url = start_redis(tmp)
            servers.append(redis)
            targets = [("shortener", s_url)]
            for store, extra in (("memory", []), ("redis", ["--redis", redis_url])):
                proxypool, p = start(
                    [proxypool_bin, "serve", "--upstreams", str(upstreams),
                     "--proxy-listen", "127.0.0.1:0", "--api-listen", "127.0.0.1:0", *extra],
                    ["api listening on ", "gateway listening on "],
                )
                servers.append(proxypool)
                targets.append((f"proxypool ({store})", p["api listening on "]))
                # A redirect (unknown code) through the gateway (its upstreams refuse: a failed
                # gateway request is counted too).
                request(f"{s_url}/nothing-here", proxy=f"http://{p['gateway listening on ']}")
            # A create (refused: no long_url) and a redirect.
            request(f"{s_url}/api/v1/links", data=b"{}")
            request(f"{s_url}/nothing-here")
            missing = []
            all_queries = []
            for target, url in targets:
                product = target.split()[0]
                samples = scrape(url)
                wanted = rule_names(product)
                if not wanted:
                    sys.exit(f"no {product}_* metric found in {product}.rules.yml")
                missing += sorted(f"{target} alert: {n}" for n in wanted - samples.keys())
                print(f"{target}: {len(wanted)} metrics used by alerts, all exported"
                      if not wanted - samples.keys() else f"{target}: missing {wanted - samples.keys()}")
                queries = dashboard_queries(product)
                all_queries += queries
                problems = dashboard_problems(product, queries, samples)
                missing += [f"{target} dashboard: {p}" for p in problems]
                used = {n for q in queries for n in re.findall(rf"\b{product}_[a-z0-9_]+", q)}
                print(f"{target}: dashboard of {len(queries)} queries over {len(used)} metrics"
                      + (", all exported with the labels queried" if not problems else f": {len(problems)} problems"))
        finally:
            for server in servers:
                server.terminate()
                server.wait(10)
    all_queries = list(dict.fromkeys(all_queries))
    check_promql(all_queries)
    print(f"dashboards: {len(all_queries)} queries parsed by promtool")
    if missing:
        sys.exit("metrics the alerts or dashboards use but the services do not export:\n  "
                 + "\n  ".join(missing))


if __name__ == "__main__":
    main()
