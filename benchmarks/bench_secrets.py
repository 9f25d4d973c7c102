"""Secret detection: what it costs a recovery, and how often it masks something ordinary.

Cost: everything redaction adds to one recovery (the redactor built from the environment and the
failed frame's locals, the first prompt and ten tool results scanned), next to the same work
with known-value masking only (what redaction cost before value detection).

False positives: the share of ordinary values the detector would mask. The corpus is this
project's own source lines (files that plant secrets on purpose left out), test data, typical
JSON payloads, UUIDs, git SHAs and hex digests: none of them is a secret.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks._common import Row, row

ROOT = Path(__file__).resolve().parent.parent
# Files whose lines are secrets planted on purpose (true positives, not false ones).
_PLANTING = {
    "test_secrets.py", "test_secrets_planted.py", "test_secrets_formats.py", "test_redact.py",
    "secrets.py",
}  # fmt: skip


def _frame_locals() -> dict[str, Any]:
    """The locals of a typical request handler that failed."""
    return {
        "request_id": str(uuid.UUID(int=7)),
        "user": {"id": 42, "email": "ada@example.com", "roles": ["admin", "dev"]},
        "payload": {"items": [{"sku": f"SKU-{i}", "qty": i, "price": i * 1.5} for i in range(40)]},
        "settings": {"region": "eu-west-1", "db_password": "not-shown-1", "timeout": 30},
        "rows": [(i, f"name-{i}", hashlib.sha1(str(i).encode()).hexdigest()) for i in range(200)],
        "text": "lorem ipsum dolor sit amet " * 200,
    }


def _prompt() -> str:
    from crashoverride._security.text import format_traceback, summarize_locals

    try:
        json.loads("{" + "x" * 50)
    except ValueError as exc:
        traceback_text = format_traceback(exc)
    source = (ROOT / "src" / "crashoverride" / "_core" / "pipeline.py").read_text()
    return "\n\n".join([traceback_text, summarize_locals(_frame_locals()), source[:8_000]])


def _median_ms(fn: Any, repeats: int = 15) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return samples[len(samples) // 2]


def _recovery_cost(detect: bool) -> float:
    from crashoverride._security import redact as _redact
    from crashoverride._security.masking import secret_values
    from crashoverride._security.secrets import is_secret_name

    prompt = _prompt()
    result = repr(_frame_locals())[:4_000]
    frame = _frame_locals()

    def one_recovery() -> None:
        found = secret_values([frame], is_secret_name)
        redact = _redact.Redactor(found)
        redact(prompt)
        for _ in range(10):
            redact(result)

    if detect:
        return _median_ms(one_recovery)
    # Known values only: the detector replaced by the identity.
    original = _redact.secrets.mask
    _redact.secrets.mask = lambda text, *_: text  # type: ignore[assignment]
    try:
        return _median_ms(one_recovery)
    finally:
        _redact.secrets.mask = original


def _source_lines() -> list[str]:
    lines: list[str] = []
    for folder in ("src", "tests", "benchmarks", "examples"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name not in _PLANTING:
                lines.extend(line for line in path.read_text().splitlines() if line.strip())
    return lines


def _test_data() -> list[str]:
    """The string constants of the test suite: messages, payloads, paths, names."""
    import ast

    values: list[str] = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name in _PLANTING:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value:
                values.append(node.value)
    return values


def _json_payloads(count: int = 500) -> list[str]:
    rng = random.Random(11)
    payloads = []
    for i in range(count):
        payloads.append(
            json.dumps(
                {
                    "id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                    "object": rng.choice(["order", "invoice", "event", "user"]),
                    "created": 1_700_000_000 + i,
                    "amount": rng.randint(1, 10_000),
                    "currency": "eur",
                    "email": f"user{i}@example.com",
                    "url": f"https://api.example.com/v1/orders/{i}?expand=items&page={i % 7}",
                    "etag": hashlib.md5(str(i).encode()).hexdigest(),
                    "commit": hashlib.sha1(str(i).encode()).hexdigest(),
                    "token_type": "bearer",
                    "max_tokens": 4096,
                    "status": rng.choice(["paid", "open", "void"]),
                    "tags": ["alpha", "beta"][: i % 3],
                    "description": "Basic plan, billed monthly",
                }
            )
        )
    return payloads


def _identifiers(count: int = 1_000) -> list[str]:
    rng = random.Random(5)
    shas = subprocess.run(
        ["git", "-C", str(ROOT), "log", f"-{count}", "--format=%H"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    values = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(count)]
    values += shas
    values += [hashlib.sha256(str(i).encode()).hexdigest() for i in range(count)]
    return values


def _rate(values: list[str]) -> tuple[float, int]:
    from crashoverride._security.secrets import spans

    flagged = sum(1 for value in values if next(spans(value), None) is not None)
    return (flagged / len(values) if values else 0.0), len(values)


def run() -> list[Row]:
    from crashoverride._security.redact import MASK, Redactor
    from crashoverride._security.secrets import mask

    rows: list[Row] = []
    prompt = _prompt()
    _ = mask(prompt, MASK)  # compile the pattern once, as the first recovery does
    scan = _median_ms(lambda: mask(prompt, MASK), repeats=31)
    rows.append(
        row(
            f"secrets: value scan of a first prompt ({len(prompt) // 1000} KB)",
            scan,
            "ms",
            note="secrets.mask over traceback + locals summary + source",
        )
    )
    with_detector = _recovery_cost(detect=True)
    known_only = _recovery_cost(detect=False)
    rows.append(
        row(
            "secrets: redaction cost per recovery (prompt + 10 tool results + locals walk)",
            with_detector,
            "ms",
            baseline=known_only,
            target="< 50 ms",
            note="baseline: known-value masking only (no value detection)",
        )
    )
    rows.append(
        row(
            "secrets: Redactor() (environment scanned, cached)",
            _median_ms(lambda: Redactor(), repeats=31),
            "ms",
        )
    )
    corpora = {
        "own source lines": _source_lines(),
        "test data (string constants of the tests)": _test_data(),
        "typical JSON payloads": _json_payloads(),
        "UUIDs, git SHAs, sha256 digests": _identifiers(),
    }
    for name, values in corpora.items():
        rate, size = _rate(values)
        rows.append(
            row(
                f"secrets: false positives, {name}",
                rate * 100,
                "%",
                target="0 % for identifiers; < 1 % otherwise",
                note=f"{size} values; flagged ones: python -m benchmarks.bench_secrets",
            )
        )
    return rows


def flagged_examples(limit: int = 20) -> list[str]:
    """The ordinary source lines the detector flags (for tuning; ``python -c``)."""
    from crashoverride._security.secrets import spans

    hits = [line for line in _source_lines() if next(spans(line), None) is not None]
    return [re.sub(r"\s+", " ", line)[:160] for line in hits[:limit]]


if __name__ == "__main__":
    from benchmarks._common import format_table

    print(format_table(run()))
    for line in flagged_examples():
        print("flagged:", line)
