"""Benchmark of serving SmolLM2-135M-Instruct over HTTP (issue 16, "Measure"): ``maxjax serve``
against llama.cpp's server (``llama-cpp-python[server]``) on the same GGUF, in one run.

Each server runs alone, in its own process, on the same cores; the load generator (this process,
``httpx`` on asyncio) runs bounded closed-loop load on localhost at 1, 8 and 32 concurrent clients:
each client sends its fixed list of prompts one after another (``/v1/completions``, ``stream:
true``, ``max_tokens`` 128, greedy), so every level sends ``clients x prompts`` requests. Per
level: requests/s and output tokens/s over the level's wall time; time to first token (request
sent to first text chunk) and inter-token latency (gap between text chunks) at p50 and p99; and
each request's decode speed (tokens after the first over the time from first to last chunk).
Output tokens are counted by re-tokenizing each completion's text with the GGUF's tokenizer (the
same count for both servers, which stream one chunk per token but may merge pieces).

Also measured: ``maxjax generate``'s batch-1 decode speed (the CLI's own tokens/s, compile
excluded), the goal's reference for one client: ``--generate-runs`` rounds over the prompts the
one-client level sends, half before maxjax's server starts and half after it stops, and the median
of all runs (a single run here moves by 20-30% from one run to the next, so one statistic, the
median, is taken on both sides of the ratio; the best run is recorded beside it).

Goals (PASS/FAIL): at 32 clients, maxjax's output tokens/s >= 3x llama.cpp's server and its p99
time to first token < 2 s; at 1 client, maxjax's per-request decode speed within 10% of
``maxjax generate``'s batch-1 decode.

The llama.cpp server runs with ``/work/tokref/bin/python`` (``--llama-python``; its
``llama_model_default_params`` patched to ``use_extra_bufts=False`` as in ``generate.py``),
``--n_threads T --n_threads_batch T`` (``--threads``, default 2) and ``--interrupt_requests
False`` (else each new request cuts the one streaming). It serves one request at a time. When
that Python is missing, the run says so and measures maxjax alone (no ratio, that goal SKIPPED).

Saves ``benchmarks/results/serve.json`` and ``serve.png`` (``serve_quick.*`` with ``--quick``:
one prompt per client), with the CPU's vector features, load average and the CPU time the rest of
the machine used during each server's run (figures taken above 10% are flagged: not clean).

    python benchmarks/serve.py [--quick] [--clients 1,8,32] [--prompts 3] [--max-tokens 128] [--arithmetic int8] [--results DIR] [--stem NAME]
    python benchmarks/serve.py --replot benchmarks/results/serve.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
LLAMA_PYTHON = "/work/tokref/bin/python"
LABELS = {"maxjax": "maxjax serve", "llama": "llama.cpp server"}

PROMPTS = [
    "Once upon a time, in a small village by the sea,",
    "The history of the Roman Empire begins",
    "Here is a recipe for a simple tomato soup:",
    "def quicksort(items):",
    "The three most important inventions of the twentieth century are",
    "Dear diary, today I",
    "In physics, the law of conservation of energy states that",
    "A short story about a robot who learns to paint:",
]

_LLAMA_LAUNCH = f"""
import sys
import llama_cpp.llama_cpp as C
sys.path.insert(0, {str(HERE)!r})
from generate import llama_without_extra_bufts  # stdlib-only module top: no maxjax, no jax
llama_without_extra_bufts(C)
from llama_cpp.server.__main__ import main
sys.argv = ["llama_cpp.server"] + sys.argv[1:]
main()
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_busy_s() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat)."""
    try:
        fields = [float(x) for x in open("/proc/stat").readline().split()[1:]]
    except OSError:
        return float("nan")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its waited-for children (/proc/PID/stat)."""
    try:
        parts = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return sum(float(x) for x in parts[11:15]) / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    i = min(len(xs) - 1, max(0, int(round(q / 100 * (len(xs) - 1)))))
    return xs[i]


# -- servers ---------------------------------------------------------------------------------------
class ServerProcess:
    def __init__(self, name: str, argv: list[str], port: int, model: str, log_path: pathlib.Path, env: dict | None = None):
        self.name, self.port, self.model, self.log_path = name, port, model, log_path
        self.base = f"http://127.0.0.1:{port}"
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})})  # fmt: skip
        self.started = time.perf_counter()

    def wait_ready(self, timeout: float, path: str) -> float:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                if httpx.get(self.base + path, timeout=2).status_code == 200:
                    return time.perf_counter() - self.started
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} was not ready within {timeout:.0f} s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._log.close()
        return self.proc.returncode


def start_maxjax(args: argparse.Namespace, tmp: pathlib.Path) -> ServerProcess:
    port = free_port()
    argv = [sys.executable, "-m", "maxjax.cli", "serve", "--port", str(port), "--max-batch", str(args.max_batch),
            "--max-queue", str(max(64, args.max_batch * 4)), "--max-context", str(args.max_context), "--log-level", "warning",
            "--arithmetic", args.arithmetic]  # fmt: skip
    return ServerProcess("maxjax", argv, port, "SmolLM2-135M-Instruct.Q4_1", tmp / "maxjax.log")


def start_llama(args: argparse.Namespace, tmp: pathlib.Path, gguf: str) -> ServerProcess:
    port = free_port()
    t = str(args.threads)
    argv = [args.llama_python, "-c", _LLAMA_LAUNCH, "--model", gguf, "--model_alias", "smollm2", "--host", "127.0.0.1",
            "--port", str(port), "--n_threads", t, "--n_threads_batch", t, "--n_ctx", str(args.max_context),
            "--interrupt_requests", "False", "--verbose", "False"]  # fmt: skip
    return ServerProcess("llama", argv, port, "smollm2", tmp / "llama.log")


# -- load ------------------------------------------------------------------------------------------
async def one_request(http, server: ServerProcess, prompt: str, max_tokens: int) -> dict:
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    t0 = time.perf_counter()
    chunks: list[float] = []
    text: list[str] = []
    error = None
    try:
        async with http.stream("POST", server.base + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            else:
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    d = json.loads(line[6:])
                    if d.get("choices") and d["choices"][0].get("text"):
                        chunks.append(time.perf_counter())
                        text.append(d["choices"][0]["text"])
    except Exception as e:  # recorded, counted as an error
        error = f"{type(e).__name__}: {e}"
    return {"start": t0, "end": time.perf_counter(), "chunks": chunks, "text": "".join(text), "error": error}


async def run_level(server: ServerProcess, clients: int, prompts_per_client: int, max_tokens: int, timeout: float) -> list[dict]:
    import httpx

    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:

        async def client(i: int) -> list[dict]:
            out = []
            for j in range(prompts_per_client):
                out.append(await one_request(http, server, PROMPTS[(i + j) % len(PROMPTS)], max_tokens))
            return out

        per_client = await asyncio.gather(*[client(i) for i in range(clients)])
    return [r for rs in per_client for r in rs]


def summarize(results: list[dict], wall: float, count_tokens) -> dict:
    ok = [r for r in results if r["error"] is None and r["chunks"]]
    tokens = [count_tokens(r["text"]) for r in ok]
    ttft = [r["chunks"][0] - r["start"] for r in ok]
    itl = [b - a for r in ok for a, b in zip(r["chunks"], r["chunks"][1:])]
    decode = [(n - 1) / (r["chunks"][-1] - r["chunks"][0]) for r, n in zip(ok, tokens) if n > 1 and r["chunks"][-1] > r["chunks"][0]]
    return {
        "requests": len(results), "errors": len(results) - len(ok), "error_examples": [r["error"] for r in results if r["error"]][:3],
        "wall_s": wall, "requests_per_s": len(ok) / wall, "output_tokens": sum(tokens), "output_tokens_per_s": sum(tokens) / wall,
        "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99), "itl_p50_s": pct(itl, 50), "itl_p99_s": pct(itl, 99),
        "decode_tokens_per_s_median": statistics.median(decode) if decode else None,
        "tokens_per_request_median": statistics.median(tokens) if tokens else None,
    }  # fmt: skip


def measure_server(server: ServerProcess, args: argparse.Namespace, count_tokens, ready_path: str) -> dict:
    out: dict = {"server": server.name}
    out["startup_s"] = server.wait_ready(args.start_timeout, ready_path)
    log(f"[{server.name}] ready in {out['startup_s']:.0f} s")
    asyncio.run(run_level(server, 1, 1, 8, args.request_timeout))  # one short request first: connections, caches
    busy0, own0, t0 = cpu_busy_s(), process_cpu_s(server.proc.pid), time.perf_counter()
    load0 = os.getloadavg()[0]
    levels = {}
    for c in args.clients:
        t = time.perf_counter()
        results = asyncio.run(run_level(server, c, args.prompts, args.max_tokens, args.request_timeout))
        s = summarize(results, time.perf_counter() - t, count_tokens)
        levels[str(c)] = s
        log(f"[{server.name}] {c:>2} clients: {s['requests_per_s']:.2f} req/s, {s['output_tokens_per_s']:.1f} tok/s, "
            f"TTFT p50 {s['ttft_p50_s'] or 0:.2f} s p99 {s['ttft_p99_s'] or 0:.2f} s, ITL p50 {1e3 * (s['itl_p50_s'] or 0):.0f} ms "
            f"p99 {1e3 * (s['itl_p99_s'] or 0):.0f} ms, errors {s['errors']}")  # fmt: skip
    span = time.perf_counter() - t0
    own = process_cpu_s(server.proc.pid) - own0
    me = time.process_time()
    other = cpu_busy_s() - busy0 - own
    out["levels"] = levels
    if server.name == "maxjax":  # prefill calls per admitted request (batched prefill: fewer than one)
        out["engine_counters"] = scrape(server, ("maxjax_prefill_calls_total", "maxjax_prompt_tokens_total"))
    out["contention"] = {
        "other_cpu_share": max(0.0, other) / (span * (os.cpu_count() or 1)), "load_average_start": load0,
        "load_average_end": os.getloadavg()[0], "server_cpu_s": own, "client_cpu_s_total": me,
    }  # fmt: skip
    out["exit_status"] = server.stop()
    return out


def scrape(server: ServerProcess, names: tuple[str, ...]) -> dict:
    """Counters from the server's ``GET /metrics`` (names absent there are left out)."""
    import httpx

    out = {}
    try:
        for line in httpx.get(server.base + "/metrics", timeout=10).text.splitlines():
            name, _, value = line.partition(" ")
            if name in names:
                out[name] = float(value)
    except httpx.HTTPError as e:
        out["error"] = str(e)
    return out


def generate_b1(args: argparse.Namespace, rounds: int) -> list[float]:
    """``maxjax generate``'s own batch-1 decode figures (the CLI's summary line): ``rounds`` runs
    of each prompt the one-client level sends."""
    speeds = []
    for _ in range(rounds):
        for prompt in PROMPTS[: args.prompts]:
            p = subprocess.run([sys.executable, "-m", "maxjax.cli", "generate", "--max-new-tokens", str(args.max_tokens), "--no-progress",
                                "--arithmetic", args.arithmetic, prompt], capture_output=True, text=True, timeout=600)  # fmt: skip
            m = re.search(r"([\d.]+) tokens/s", p.stderr)
            if p.returncode == 0 and m:
                speeds.append(float(m.group(1)))
            else:
                log(f"[generate] failed: {p.stderr.strip()[-500:]}")
    log(f"[generate] batch-1 decode: {speeds} tok/s")
    return speeds


def generate_summary(runs: list[float]) -> dict:
    return {"tokens_per_s_runs": runs, "tokens_per_s": statistics.median(runs) if runs else None,
            "tokens_per_s_best": max(runs) if runs else None}  # fmt: skip


# -- report ----------------------------------------------------------------------------------------
def verdicts(r: dict) -> list[dict]:
    out = []
    mx, ll = r["servers"].get("maxjax", {}).get("levels", {}), r["servers"].get("llama", {}).get("levels", {})
    top = str(max(r["clients"]))
    if top in mx and top in ll:
        ratio = mx[top]["output_tokens_per_s"] / ll[top]["output_tokens_per_s"]
        out.append({"goal": f"{top} clients: output tok/s >= 3x llama.cpp server", "value": f"{ratio:.2f}x", "ok": ratio >= 3})
    else:
        out.append({"goal": f"{top} clients: output tok/s >= 3x llama.cpp server", "value": "llama.cpp not run", "ok": None})
    if top in mx and mx[top]["ttft_p99_s"] is not None:
        v = mx[top]["ttft_p99_s"]
        out.append({"goal": f"{top} clients: p99 time to first token < 2 s", "value": f"{v:.2f} s", "ok": v < 2})
    g = r.get("generate", {}).get("tokens_per_s")
    if "1" in mx and g and mx["1"]["decode_tokens_per_s_median"]:
        ratio = mx["1"]["decode_tokens_per_s_median"] / g
        out.append({"goal": "1 client: decode within 10% of maxjax generate batch 1", "value": f"{ratio:.2f}x", "ok": ratio >= 0.9})
    return out


def cpu_text(r: dict) -> str:
    v = r["machine"]["cpu_vector_features"]
    feats = v.get("vector_features", v) if isinstance(v, dict) else v
    return f"{v.get('machine', '') if isinstance(v, dict) else ''} {'/'.join(feats) if isinstance(feats, list) else feats}".strip()


def table(r: dict) -> str:
    rows = [f"serve benchmark ({'quick' if r['quick'] else 'full'}): {r['prompts_per_client']} prompt(s) per client, "
            f"{r['max_tokens']} new tokens, CPU {cpu_text(r)}, {r['machine']['cpus']} cores",
            f"{'server':<18}{'clients':>8}{'req/s':>8}{'tok/s':>9}{'TTFT p50':>10}{'TTFT p99':>10}{'ITL p50':>9}{'ITL p99':>9}"
            f"{'dec/req':>9}{'errors':>8}"]  # fmt: skip
    for name, s in r["servers"].items():
        if "levels" not in s:
            rows.append(f"{LABELS.get(name, name):<18}  not run: {s.get('skipped', s.get('error', ''))}")
            continue
        for c, v in s["levels"].items():
            f = lambda x, scale=1.0, d=2: "-" if x is None else f"{x * scale:.{d}f}"  # noqa: E731
            rows.append(f"{LABELS.get(name, name):<18}{c:>8}{v['requests_per_s']:>8.2f}{v['output_tokens_per_s']:>9.1f}"
                        f"{f(v['ttft_p50_s']):>10}{f(v['ttft_p99_s']):>10}{f(v['itl_p50_s'], 1e3, 0):>9}{f(v['itl_p99_s'], 1e3, 0):>9}"
                        f"{f(v['decode_tokens_per_s_median'], 1, 1):>9}{v['errors']:>8}")  # fmt: skip
        e = s.get("engine_counters", {})
        if "maxjax_prefill_calls_total" in e:
            rows.append(f"{'':<18}prefill calls {e['maxjax_prefill_calls_total']:.0f} (all levels, warm-up request included)")
        c = s["contention"]
        flag = "  NOT CLEAN (>10%)" if c["other_cpu_share"] > 0.10 else ""
        rows.append(f"{'':<18}other processes used {100 * c['other_cpu_share']:.0f}% of the CPUs, load average "
                    f"{c['load_average_start']:.1f} -> {c['load_average_end']:.1f}{flag}")  # fmt: skip
    g = r.get("generate", {})
    best = g.get("tokens_per_s_best", max(g.get("tokens_per_s_runs") or [0]) or None)
    rows.append(f"maxjax generate batch-1 decode: median {g.get('tokens_per_s') or '-'} tok/s, best {best or '-'} "
                f"(runs {g.get('tokens_per_s_runs')})")
    rows.append("(TTFT/ITL in s/ms; dec/req = median per-request decode tok/s)")
    for v in r["verdicts"]:
        mark = "SKIPPED" if v["ok"] is None else ("PASS" if v["ok"] else "FAIL")
        rows.append(f"  {mark:<8}{v['goal']}: {v['value']}")
    return "\n".join(rows)


def plot(r: dict, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for name, s in r["servers"].items():
        if "levels" not in s:
            continue
        cs = [int(c) for c in s["levels"]]
        lv = list(s["levels"].values())
        label = LABELS.get(name, name)
        axes[0].plot(cs, [v["output_tokens_per_s"] for v in lv], "o-", label=label)
        axes[1].plot(cs, [v["ttft_p50_s"] for v in lv], "o-", label=f"{label} p50")
        axes[1].plot(cs, [v["ttft_p99_s"] for v in lv], "s--", label=f"{label} p99")
        axes[2].plot(cs, [1e3 * (v["itl_p50_s"] or 0) for v in lv], "o-", label=f"{label} p50")
        axes[2].plot(cs, [1e3 * (v["itl_p99_s"] or 0) for v in lv], "s--", label=f"{label} p99")
    g = r.get("generate", {}).get("tokens_per_s")
    if g:
        axes[0].axhline(g, color="gray", ls=":", label="maxjax generate b1 decode")
    for ax, title, unit in zip(axes, ("output tokens/s", "time to first token", "inter-token latency"), ("tok/s", "s", "ms")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(r["clients"], [str(c) for c in r["clients"]])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    fig.suptitle(f"SmolLM2-135M Q4_1 served on localhost ({cpu_text(r)}, {r['machine']['cpus']} cores"
                 f"{', quick' if r['quick'] else ''})")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one prompt per client (a check that everything runs)")
    ap.add_argument("--clients", default="1,8,32", help="concurrency levels (default 1,8,32)")
    ap.add_argument("--prompts", type=int, default=3, help="prompts each client sends (default 3; --quick: 1)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--servers", default="maxjax,llama")
    ap.add_argument("--llama-python", default=LLAMA_PYTHON)
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads (default 2)")
    ap.add_argument("--max-batch", type=int, default=32, help="maxjax serve --max-batch (default 32)")
    ap.add_argument("--max-context", type=int, default=512, help="both servers' context (default 512)")
    ap.add_argument("--arithmetic", choices=("auto", "float32", "int8"), default="auto",
                    help="maxjax serve's and the generate reference's --arithmetic (default auto)")
    ap.add_argument("--generate-runs", type=int, default=2,
                    help="rounds of maxjax generate over the one-client prompts, half before the server, half after (default 2)")
    ap.add_argument("--start-timeout", type=float, default=900)
    ap.add_argument("--request-timeout", type=float, default=900)
    ap.add_argument("--replot", metavar="JSON", help="print the table of a saved run and redraw its PNG")
    ap.add_argument("--results", type=pathlib.Path, default=RESULTS, help="folder for the JSON and PNG (default benchmarks/results)")
    ap.add_argument("--stem", help="their file name (default serve, serve_quick with --quick)")
    args = ap.parse_args()
    if args.replot:
        r = json.loads(pathlib.Path(args.replot).read_text())
        print(table(r))
        plot(r, pathlib.Path(args.replot).with_suffix(".png"))
        return 0
    args.clients = [int(c) for c in args.clients.split(",")]
    if args.quick:
        args.prompts = 1
    servers = [s for s in args.servers.split(",") if s]

    sys.path.insert(0, str(ROOT))
    from maxjax._bundled import smollm2_gguf_path
    from maxjax.backend import cpu_vector_features
    from maxjax.tokenizer import Tokenizer

    gguf = str(smollm2_gguf_path())
    tok = Tokenizer.from_gguf(gguf)
    count_tokens = lambda text: len(tok.encode(text))  # noqa: E731
    r: dict = {
        "benchmark": "serve", "quick": args.quick, "clients": args.clients, "prompts_per_client": args.prompts,
        "max_tokens": args.max_tokens, "max_batch": args.max_batch, "max_context": args.max_context, "gguf": gguf,
        "arithmetic": args.arithmetic,
        "machine": {"cpu_vector_features": cpu_vector_features(), "cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version(), "load_average_at_start": os.getloadavg()},
        "time": time.strftime("%Y-%m-%d %H:%M:%S"), "servers": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as d:
        tmp = pathlib.Path(d)
        if "maxjax" in servers:
            runs = generate_b1(args, -(-args.generate_runs // 2))
            try:
                r["servers"]["maxjax"] = measure_server(start_maxjax(args, tmp), args, count_tokens, "/health")
            except Exception as e:
                r["servers"]["maxjax"] = {"error": str(e)[-2000:]}
                log(f"[maxjax] failed: {e}")
            runs += generate_b1(args, args.generate_runs // 2)
            r["generate"] = generate_summary(runs)
        if "llama" in servers:
            if not pathlib.Path(args.llama_python).exists():
                msg = f"{args.llama_python} not found: install llama-cpp-python[server] there, or pass --llama-python"
                log(f"[llama] SKIPPED: {msg}")
                r["servers"]["llama"] = {"skipped": msg}
            else:
                try:
                    r["servers"]["llama"] = measure_server(start_llama(args, tmp, gguf), args, count_tokens, "/v1/models")
                except Exception as e:
                    r["servers"]["llama"] = {"error": str(e)[-2000:]}
                    log(f"[llama] failed: {e}")
    r["verdicts"] = verdicts(r)
    print(table(r))
    args.results.mkdir(parents=True, exist_ok=True)
    stem = args.stem or ("serve_quick" if args.quick else "serve")
    (args.results / f"{stem}.json").write_text(json.dumps(r, indent=1))
    plot(r, args.results / f"{stem}.png")
    log(f"saved {args.results / (stem + '.json')} and {stem}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
