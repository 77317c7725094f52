"""The engine's metrics (triton/engine_metrics.py) on the session's served tiny model: vLLM's set on Triton's
metrics port, with no prompt text in it; and a real Prometheus (Debian's) scraping them under a short load,
queried through its HTTP API with exactly the Grafana dashboard's queries (deploy/grafana-dashboard.json)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import threading
import time
import uuid

import openai
import pytest
import requests
from conftest import REPO, free_ports
from test_serve import wait_idle

from trtllm_pipeline.triton import engine_metrics as em

pytestmark = pytest.mark.slow

NAME = "tiny-qwen2-fp8-tp1"
PROMETHEUS = "/usr/bin/prometheus"
DASHBOARD = REPO / "deploy" / "grafana-dashboard.json"
SCRAPE_S = 1


@pytest.fixture(scope="module")
def server(served):
    return served(NAME)


def metrics_text(server) -> str:
    return requests.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text


def engine_metrics(server) -> dict[str, float]:
    """Every ``trtllm_pipeline:`` sample on the metrics port, by its name and labels as printed."""
    found = re.findall(r"^(trtllm_pipeline:\w+\{[^}]*\}) (\S+)$", metrics_text(server), re.MULTILINE)
    return {key: float(value) for key, value in found}


def documented() -> dict[str, str]:
    """The metrics table of docs/serving.md: name -> type."""
    text = (REPO / "docs" / "serving.md").read_text()
    return dict(re.findall(r"^\| `trtllm_pipeline:(\w+)` \| (\w+) \|", text, re.MULTILINE))


def test_the_engine_exports_vllms_set_by_model_name_and_no_prompt_text(server):
    marker = f"zebra-{uuid.uuid4().hex}"
    with openai.OpenAI(base_url=f"http://127.0.0.1:{server.openai_port}/v1", api_key="-", max_retries=0) as client:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": f"Repeat {marker}"}],
                                       max_tokens=8, temperature=0)
    text = metrics_text(server)
    assert marker not in text and marker[6:] not in text  # numbers about requests, never their text
    kinds = dict(re.findall(r"^# TYPE trtllm_pipeline:(\w+) (\w+)$", text, re.MULTILINE))
    made = {name: "counter" for name, _ in em.COUNTERS.values()} | {em.OUTCOME[0]: "counter"} | \
        {name: "histogram" for name, _, _ in em.HISTOGRAMS.values()} | \
        {em.STATS[key][1]: em.STATS[key][0].lower() for key in ("requests_running", "requests_waiting")}
    assert {name: kinds.get(name) for name in made} == made
    for name, kind in kinds.items():  # vLLM's conventions
        assert name.endswith("_total") == (kind == "counter"), name
        assert kind != "histogram" or name.endswith("_seconds"), name
    samples = re.findall(r"^trtllm_pipeline:\w+\{([^}]*)\}", text, re.MULTILINE)
    assert samples and all(f'model_name="{NAME}"' in labels for labels in samples)
    assert set(re.findall(r'outcome="(\w+)"', text)) == set(em.OUTCOMES)
    # docs/serving.md's table names every metric the engine can export, with its type
    every = made | {name: kind.lower() for kind, name, _ in em.STATS.values()}
    assert documented() == every


# --------------------------------------------------------------------------- a real Prometheus


class Prometheus:
    """Debian's prometheus on a free 127.0.0.1 port with its data in ``folder``, scraping ``target`` every second."""

    def __init__(self, folder, target: str):
        (self.port,) = free_ports(1)
        config = folder / "prometheus.yml"
        config.write_text(json.dumps({  # YAML is a superset of JSON
            "global": {"scrape_interval": f"{SCRAPE_S}s", "evaluation_interval": f"{SCRAPE_S}s"},
            "scrape_configs": [{"job_name": "trtllm-pipeline", "static_configs": [{"targets": [target]}]}]}))
        self.log = folder / "prometheus.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log.read_text()
            try:
                if requests.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except requests.ConnectionError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"prometheus was not ready after {timeout} s: {self.log.read_text()}")

    def query(self, expr: str) -> list[dict]:
        body = requests.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def scraped_since(self, moment: float, timeout: float = 30) -> None:
        """Wait until a scrape that began after ``moment`` (time.time()) is stored."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # timestamp() of a plain selector is its last sample's time (of an expression: the query's)
            last, up = self.query('timestamp(up{job="trtllm-pipeline"})'), self.query('up{job="trtllm-pipeline"}')
            if last and float(last[0]["value"][1]) > moment and up[0]["value"][1] == "1":
                return
            time.sleep(0.2)
        raise AssertionError(f"no scrape after {moment}: {self.query('up')}")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def panels() -> dict[str, list[str]]:
    """The dashboard's panels: title -> their queries, with Grafana's variables as this test's values."""
    dashboard = json.loads(DASHBOARD.read_text())
    return {p["title"]: [t["expr"].replace("$model_name", NAME).replace("$__rate_interval", "1m")
                         for t in p["targets"]] for p in dashboard["panels"]}


def values(result: list[dict], label: str | None = None) -> dict:
    return {(r["metric"].get(label) if label else None): float(r["value"][1]) for r in result}


# Tokens a load request is forced to: enough that two rounds of 4 concurrent requests outlast a couple of 1 s scrapes
# on a fast CPU (at 96, ~0.6 s here: a load could fall between two scrapes and the running gauge read 0 throughout)
LOAD_TOKENS = 512


def load(server, requests_: int = 8, concurrency: int = 4, tokens: int = LOAD_TOKENS) -> tuple[int, int]:
    """Streamed chat requests forced to ``tokens`` tokens; (prompt, completion) tokens as their usage said."""
    got, errors, lock = [], [], threading.Lock()
    todo = iter(range(requests_))

    def worker():
        with openai.OpenAI(base_url=f"http://127.0.0.1:{server.openai_port}/v1", api_key="-", max_retries=0) as c:
            for i in iter(lambda: next(todo, None), None):
                try:
                    chunks = list(c.chat.completions.create(
                        model=NAME, messages=[{"role": "user", "content": f"Count to {i}."}], max_tokens=tokens,
                        temperature=0, stream=True, stream_options={"include_usage": True},
                        extra_body={"min_tokens": tokens}))
                    with lock:
                        got.append(chunks[-1].usage)
                except Exception as exc:  # reported below
                    errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and len(got) == requests_
    return sum(u.prompt_tokens for u in got), sum(u.completion_tokens for u in got)


def test_prometheus_scrapes_the_engine_and_every_dashboard_query_answers(server, tmp_path):
    if not os.access(PROMETHEUS, os.X_OK):
        message = f"{PROMETHEUS} missing: apt-get install prometheus (.ci/run does)"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    queries = panels()
    prometheus = Prometheus(tmp_path, f"127.0.0.1:{server.metrics_port}")
    try:
        prometheus.wait_ready()
        wait_idle(server)
        prometheus.scraped_since(time.time())
        tokens, outcomes = [queries["Tokens since the server started"], queries["Requests since the server started"]]
        before = [values(prometheus.query(q)) for q in tokens], values(prometheus.query(outcomes[0]), "outcome")
        prompt_tokens, completion_tokens = load(server)
        wait_idle(server)
        prometheus.scraped_since(time.time())
        after = [values(prometheus.query(q)) for q in tokens], values(prometheus.query(outcomes[0]), "outcome")
        # The counters moved by exactly what the load generator was told in each answer's usage.
        assert after[0][0][None] - before[0][0][None] == prompt_tokens
        assert after[0][1][None] - before[0][1][None] == completion_tokens == 8 * LOAD_TOKENS
        assert {o: after[1][o] - before[1][o] for o in em.OUTCOMES} == {"finished": 8, "stopped": 0, "aborted": 0,
                                                                          "failed": 0}
        check_panels(prometheus, queries, engine_metrics(server))
        assert NAME in requests.get(f"{prometheus.url}/api/v1/label/model_name/values", timeout=10,
                                    params={"match[]": "trtllm_pipeline:num_requests_running"}).json()["data"]
    finally:
        prometheus.close()


def check_panels(prometheus: Prometheus, queries: dict[str, list[str]], exported: dict[str, float]) -> None:
    """Each panel's queries, right after the load (its rates and quantiles over the last minute)."""
    def exports(name: str) -> bool:
        return any(key.startswith(f"trtllm_pipeline:{name}{{") for key in exported)

    checked = set()
    running, waiting = queries["Requests running and waiting"]
    assert values(prometheus.query(running)) == values(prometheus.query(waiting)) == {None: 0}  # idle now
    assert values(prometheus.query(f"max_over_time({running}[2m])"))[None] >= 1  # but not during the load
    for title in ("Token throughput", "Time to first token", "Time per output token", "End-to-end request latency"):
        for expr in queries[title]:
            (value,) = values(prometheus.query(expr)).values()
            assert 0 < value < math.inf, (title, expr, value)
    (expr,) = queries["Request outcomes"]
    rates = values(prometheus.query(expr), "outcome")
    assert set(rates) == set(em.OUTCOMES) and rates["finished"] > 0
    checked |= {"Requests running and waiting", "Token throughput", "Time to first token", "Time per output token",
                "End-to-end request latency", "Request outcomes", "Tokens since the server started",
                "Requests since the server started"}
    # The paged KV cache's figures: answered once the runtime reports them (Runtime.stats), empty until then.
    for title, name in (("KV cache usage", "kv_cache_usage_perc"), ("Prefix cache hit rate", "prefix_cache_hits_total"),
                        ("Preemptions", "num_preemptions_total")):
        (expr,) = queries[title]
        assert bool(prometheus.query(expr)) == exports(name), (title, expr)
        checked.add(title)
    assert checked == set(queries), f"panels this test does not check: {set(queries) - checked}"
