"""Fuzz harness: a few hundred corrupt inputs to every loader, each judged on its outcome.

The inputs are made by ``tests/fuzz_cases.py`` (seeded, so every run tries the same cases):
safetensors files, sharded indexes, GGUF tensor headers, Orbax checkpoints and
``load_state_dict`` argument sets; and (``build_model_cases``) llama models with corrupt GGUF
metadata, tensor headers, ``config.json`` or tensors, and ``maxjax generate`` argument sets. They run in subprocesses (many cases per process), watched
case by case: a case that takes longer than ``CASE_TIMEOUT_S`` is a hang, one that ends the
process is a crash; both are failures, and the remaining cases go on in a fresh process (at most
``MAX_RESTARTS`` times). For every case the outcome must be either

- a correct load: the values equal the oracle's (the ``safetensors``/``gguf`` package reading the
  same file, the saved state, the arrays given), or
- a clean error: a ``ValueError``/``OSError``/``KeyError`` (``WeightsFileError`` is a ValueError)
  whose message is one line and names the file or argument at fault (and for model cases the
  metadata key, ``config.json`` key or tensor: one of the case's ``fields``); a
  ``load_state_dict`` that raises leaves the module as it was.

A model that loads must have the config its file says and generate two tokens (the unchanged
model's, where the change keeps the model); a ``maxjax generate`` run must exit 0 with one summary
line, or 1 (2 for usage errors) with one error line, never a traceback.

Cases marked ``error`` must raise, cases marked ``ok`` must load. A few ``maxjax inspect`` runs
check the command line: exit status 1, one line on stderr, no traceback.

Counts, 795 cases (seed 17). Against the code before the hardening of issue 17 (222a307): 82
failed (sharded index 17: TypeErrors, shards read from outside the checkpoint; orbax 23:
multi-line or unnamed errors, TypeErrors, 3 silently changed arrays; load_state_dict 42:
TypeErrors, unnamed dtype errors, multi-line messages, symbolic-dim values not checked) and 3 of 5
``maxjax inspect`` runs (absl lines, an "Event loop is closed" traceback, an index escaping its
directory loaded). After it: 0 and 0. (The safetensors and GGUF readers had no failures.)

Model cases (``build_model_cases``, issue 17's metadata part), 644 (seed 17): a small synthetic
llama GGUF with one metadata key retyped, out of range, deleted or changed, one tensor missing,
extra, reshaped, retyped (rewritten, or in the header only) or holding NaN/Inf; the same for a
Hugging Face directory's ``config.json`` and safetensors; and ``maxjax generate`` argument sets,
run through ``maxjax.cli.main``. Against the code at 37d0189: 505 failed (GGUF 303, HF 174, CLI
28): 248 errors naming neither the file nor the field, 136 silent loads of inputs that must be
refused (NaN eps, rope base 0, NaN norms decoding "0 tokens, eos", 265-row embeddings, wrong
block counts), 51 TypeErrors, 15 AssertionErrors, 13 ZeroDivisionErrors, 5 AttributeErrors,
7 hangs (block counts of 100000 and more), 18 CLI runs with tracebacks or usage text; and 4 of 4
``maxjax generate`` processes on corrupt models. After it: 0 and 0, in about 70 s.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fuzz_cases import build_cases, build_model_cases  # noqa: E402

SEED = 17
REPO = Path(__file__).resolve().parent.parent
RUNNER = Path(__file__).resolve().parent / "fuzz_cases.py"
START_TIMEOUT_S = 120  # imports (jax, orbax) before the first case, on a busy 2-core machine
CASE_TIMEOUT_S = 20  # one case (the slowest, an orbax restore, takes well under a second)
MAX_RESTARTS = 15
CLEAN_TYPES = ("ValueError", "OSError", "KeyError")


def _env() -> dict[str, str]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("XLA_FLAGS", None)
    return env


def run_watched(
    cases: list[dict], workdir: Path, start_timeout: float = START_TIMEOUT_S, case_timeout: float = CASE_TIMEOUT_S
) -> dict[str, dict]:
    """Runs ``cases`` in subprocesses and returns each case's outcome (hangs and crashes included)."""
    results: dict[str, dict] = {}
    pending = list(cases)
    for attempt in range(MAX_RESTARTS + 1):
        if not pending:
            break
        spec = workdir / f"cases-{attempt}.json"
        spec.write_text(json.dumps(pending))
        with open(workdir / f"stderr-{attempt}.txt", "wb") as err:
            proc = subprocess.Popen([sys.executable, str(RUNNER), str(spec)], stdout=subprocess.PIPE, stderr=err, env=_env(), cwd=REPO)
            current, buf = None, b""
            deadline = time.monotonic() + start_timeout
            try:
                while True:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        proc.kill()
                        if current is not None:
                            results[current] = {"id": current, "status": "hang"}
                        break
                    ready, _, _ = select.select([proc.stdout], [], [], left)
                    if not ready:
                        continue
                    chunk = os.read(proc.stdout.fileno(), 1 << 16)
                    if not chunk:
                        code = proc.wait(timeout=30)
                        if current is not None:
                            results[current] = {"id": current, "status": "crash", "code": code}
                        break
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        msg = json.loads(line)
                        if "start" in msg:
                            current = msg["start"]
                            deadline = time.monotonic() + case_timeout
                        else:
                            results[msg["id"]] = msg
                            current = None
            finally:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=30)
                proc.stdout.close()
        pending = [c for c in pending if c["id"] not in results]
    for c in pending:
        results[c["id"]] = {"id": c["id"], "status": "not run"}
    return results


def judge(case: dict, res: dict) -> str | None:
    """None when the outcome is acceptable, else what is wrong with it."""
    status = res["status"]
    if status in ("hang", "crash", "not run"):
        return f"{status} {res.get('code', '')}".strip()
    if case["family"] == "cli":
        return judge_cli(case, res)
    names = res.get("names") or case.get("names") or []
    fields = case.get("fields") or []
    if status == "raised":
        msg = res["message"]
        if not res["clean_type"]:
            return f"raised {res['type']}: {msg[:300]}"
        if "\n" in msg:
            return f"message of {msg.count(chr(10)) + 1} lines: {msg[:300]!r}"
        if names and not any(n in msg for n in names):
            return f"message names none of {names}: {msg[:300]}"
        if fields and not any(f in msg for f in fields):
            return f"message names none of the fields {fields}: {msg[:300]}"
        if res.get("changed"):
            return f"raised but changed {res['changed']}"
        if case["expect"] == "ok":
            return f"refused a valid input: {res['type']}: {msg[:300]}"
        return None
    if res.get("mismatch"):
        return res["mismatch"][:400]
    if case["expect"] == "error":
        return "loaded an input that must be refused"
    return None


def judge_cli(case: dict, res: dict) -> str | None:
    """A ``maxjax generate`` run: exit status 0 and one summary line on stderr, or exit status 1 or 2
    (argparse) and one error line naming the argument or file at fault; never a traceback."""
    if res["status"] == "raised":
        return f"traceback: {res['type']}: {res['message'][:300]}"
    code, err = res["exit"], res["stderr"]
    lines = err.splitlines()
    if code == 0:
        if case["expect"] == "error":
            return f"exit status 0 for arguments that must be refused; stderr {err[-300:]!r}"
        if len(lines) != 1 or not lines[0].startswith("["):
            return f"exit status 0, but stderr is not one summary line: {err[-600:]!r}"
        return None
    if case["expect"] == "ok":
        return f"exit status {code} for valid arguments: {err[-300:]!r}"
    if code not in (1, 2):
        return f"exit status {code}: {err[-300:]!r}"
    if len(lines) != 1 or "Traceback" in err or not lines[0].startswith("maxjax generate: error: "):
        return f"stderr is not one error line: {err[-600:]!r}"
    names, fields = case.get("names") or [], case.get("fields") or []
    if names and not any(n in err for n in names):
        return f"the error names none of {names}: {err.strip()[:300]}"
    if fields and not any(f in err for f in fields):
        return f"the error names none of {fields}: {err.strip()[:300]}"
    return None


def test_every_corrupt_input_loads_correctly_or_fails_cleanly(tmp_path):
    t0 = time.monotonic()
    cases = build_cases(tmp_path / "inputs", SEED)
    assert len(cases) >= 300
    results = run_watched(cases, tmp_path)
    failures = {c["id"]: why for c in cases if (why := judge(c, results[c["id"]]))}
    by_family = Counter(cid.split("/")[0] for cid in failures)
    report = "\n".join(f"  {cid}: {why}" for cid, why in sorted(failures.items()))
    print(f"{len(cases)} cases, {len(failures)} failed {dict(by_family)} in {time.monotonic() - t0:.1f} s")
    assert not failures, f"{len(failures)} of {len(cases)} cases failed {dict(by_family)}:\n{report}"


def test_every_corrupt_model_and_argument_set_loads_correctly_or_fails_cleanly(tmp_path, monkeypatch):
    """GGUF metadata and tensor headers, config.json and its tensors, and ``maxjax generate``
    arguments (see ``build_model_cases``): a correct load (the config the file says, two generated
    tokens, the unchanged model's tokens where the change keeps the model) or one clean line naming
    the file and the field; never a traceback, hang, crash or silent change."""
    t0 = time.monotonic()
    cases = build_model_cases(tmp_path / "inputs", SEED)
    assert len(cases) >= 300
    monkeypatch.setenv("MAXJAX_FUZZ_CACHE_DIR", str(tmp_path / "jax-cache"))
    results = run_watched(cases, tmp_path)
    failures = {c["id"]: why for c in cases if (why := judge(c, results[c["id"]]))}
    by_family = Counter("/".join(cid.split("/")[:2]) if cid.startswith("llama/") else cid.split("/")[0] for cid in failures)
    report = "\n".join(f"  {cid}: {why}" for cid, why in sorted(failures.items()))
    print(f"{len(cases)} cases, {len(failures)} failed {dict(by_family)} in {time.monotonic() - t0:.1f} s")
    assert not failures, f"{len(failures)} of {len(cases)} cases failed {dict(by_family)}:\n{report}"


def test_the_harness_reports_a_hang_and_a_crash_and_runs_the_rest(tmp_path):
    cases = [
        {"id": f"selftest/{op}{i}", "family": "selftest", "op": op, "expect": "ok", "names": []}
        for i, op in enumerate(["ok", "hang", "ok", "crash", "ok"])
    ]
    t0 = time.monotonic()
    results = run_watched(cases, tmp_path, case_timeout=3)
    assert time.monotonic() - t0 < START_TIMEOUT_S
    verdicts = {c["id"]: judge(c, results[c["id"]]) for c in cases}
    assert verdicts == {"selftest/ok0": None, "selftest/hang1": "hang", "selftest/ok2": None, "selftest/crash3": "crash -9", "selftest/ok4": None}


def _cli(path: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "maxjax.cli", "inspect", path], capture_output=True, text=True, timeout=120, env=_env(), cwd=REPO
    )


def test_inspect_on_corrupt_inputs_prints_one_line(tmp_path):
    cases = {c["id"]: c for c in build_cases(tmp_path / "inputs", SEED)}
    picks = [
        "orbax/json0-_METADATA/restore_state",  # damaged orbax metadata
        "orbax/flip0.5-manifest.ocdbt/restore_state",  # damaged OCDBT manifest
        "safetensors/hlen-4294967296",
        "gguf/a-type-99",
        "index/value-escape-parent",
    ]
    problems = []
    for cid in picks:
        path = cases[cid]["path"]
        proc = _cli(path)
        err = proc.stderr
        if proc.returncode != 1:
            problems.append(f"{cid}: exit status {proc.returncode}, stderr {err[-300:]!r}")
        elif not err.startswith("maxjax inspect: error: ") or err.count("\n") != 1 or "Traceback" in err:
            problems.append(f"{cid}: stderr is not one error line: {err[-600:]!r}")
        elif os.path.basename(path.rstrip("/")) not in err:
            problems.append(f"{cid}: the error does not name {path}: {err!r}")
    assert not problems, f"{len(problems)} of {len(picks)} inspect runs failed:\n" + "\n".join(problems)


def test_generate_on_corrupt_models_prints_one_line(tmp_path):
    """``python -m maxjax.cli generate`` in a process of its own (what a user sees, absl and XLA
    lines included): exit status 1, one error line naming the file and the field, no traceback."""
    cases = {c["id"]: c for c in build_model_cases(tmp_path / "inputs", SEED)}
    picks = [
        "llama/gguf/block_count-100000",  # ran past 240 s growing 35 MB/s
        "llama/gguf/embedding_length-63",  # a bare AssertionError
        "llama/hf/text-0",  # config.json a list: AttributeError
        "llama/gguf/nonfinite-blk.0.attn_q.weight-nan-everywhere",  # 0 tokens "eos"
    ]
    problems = []
    for cid in picks:
        case = cases[cid]
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "maxjax.cli", "generate", "--model", case["path"], "--max-new-tokens", "2", "hello"],
                capture_output=True, text=True, timeout=START_TIMEOUT_S, env=_env(), cwd=REPO,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            problems.append(f"{cid}: hang (no exit in {START_TIMEOUT_S} s)")
            continue
        err = proc.stderr
        if proc.returncode != 1:
            problems.append(f"{cid}: exit status {proc.returncode}, stderr {err[-300:]!r}")
        elif not err.startswith("maxjax generate: error: ") or err.count("\n") != 1 or "Traceback" in err:
            problems.append(f"{cid}: stderr is not one error line: {err[-600:]!r}")
        elif case["path"] not in err or not any(f in err for f in case["fields"]):
            problems.append(f"{cid}: the error does not name the file and one of {case['fields']}: {err!r}")
    assert not problems, f"{len(problems)} of {len(picks)} generate runs failed:\n" + "\n".join(problems)


if __name__ == "__main__":  # pragma: no cover - prints the failures of one run
    pytest.main([__file__, "-q", "-s"])
