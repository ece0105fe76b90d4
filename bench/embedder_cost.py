"""What each built-in embedder costs on this machine: load time, memory, indexing and query speed.

    .venv/bin/python bench/embedder_cost.py [--chunks 120] [--queries 40]

Each embedder runs in a subprocess of its own, so its resident memory is its own: RSS after
importing numpy (the base), after loading the model, and the peak while embedding. Inputs are
real text: `--chunks` 1,200-character chunks (the index's chunk size) cut from a LongMemEval
haystack, embedded in one call as the indexer does, and `--queries` LongMemEval questions
embedded one at a time as session_search does. Tokens are counted with MiniLM's tokenizer
(WordPiece, truncated at 256 per chunk) for both, so ms per 1k tokens compare. Figures are wall
time on whatever the machine's cores are doing (`load` shows the 1-minute load average).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATA = Path(os.environ.get("PALIMPSEST_LME", ROOT.parent.parent / "shared" / "data" / "longmemeval"))
if not DATA.is_dir():
    DATA = Path("/work/shared/data/longmemeval")


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def inputs(chunks: int, queries: int) -> tuple[list[str], list[str]]:
    from store.chunking import split_chunks

    files = sorted(p for p in DATA.glob("*.json") if "_abs" not in p.name)
    texts: list[str] = []
    asked: list[str] = []
    for path in files:
        case = json.loads(path.read_text())
        asked.append(case["question"])
        for session in case["haystack_sessions"]:
            for turn in session:
                texts += split_chunks(turn["content"], 1200, 200)
        if len(texts) >= chunks and len(asked) >= queries:
            break
    return texts[:chunks], asked[:queries]


def measure(kind: str, chunks: int, queries: int) -> dict:
    """Run in the child: one embedder, its figures as a dict."""
    import numpy as np  # noqa: F401  (the base RSS includes numpy)

    texts, asked = inputs(chunks, queries)
    base = rss_mb()
    if kind == "minilm":
        from store.minilm import MiniLMEmbedder
        embedder = MiniLMEmbedder()
        started = time.perf_counter()
        model = embedder.loaded()
        tokenizer = model.tokenizer
    else:
        from store.embedders import WordLlamaEmbedder
        from store.minilm import MiniLM
        embedder = WordLlamaEmbedder()
        started = time.perf_counter()
        embedder._embed_blocking(["warm up"])
        tokenizer = None
    load_s = time.perf_counter() - started
    loaded = rss_mb()
    if tokenizer is None:  # count with MiniLM's tokenizer for both (same units), not loading its weights
        from tokenizers import Tokenizer
        import importlib.util
        import zipfile
        spec = importlib.util.find_spec("all_minilm_l6_v2")
        with zipfile.ZipFile(Path(spec.origin).parent / "model.zip") as archive:
            tokenizer = Tokenizer.from_buffer(archive.read("tokenizer.json"))
        tokenizer.enable_truncation(256)
        del MiniLM
    tokens = sum(len(e.ids) for e in tokenizer.encode_batch(texts))
    started = time.perf_counter()
    asyncio.run(embedder.embed(texts))
    index_s = time.perf_counter() - started
    times = []
    for question in asked:
        started = time.perf_counter()
        asyncio.run(embedder.embed([question + " "]))  # a fresh text each time: no memo hit
        times.append(time.perf_counter() - started)
    times.sort()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"embedder": kind, "load_s": load_s, "rss_base_mb": base, "rss_loaded_mb": loaded, "rss_peak_mb": peak,
            "chunks": len(texts), "tokens": tokens, "index_s": index_s,
            "query_p50_ms": 1000 * times[len(times) // 2], "query_max_ms": 1000 * times[-1],
            "load_avg": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=120)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--embedders", default="wordllama,minilm")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.chunks, args.queries)))
        return
    rows = []
    for kind in args.embedders.split(","):
        out = subprocess.run([sys.executable, __file__, "--child", kind, "--chunks", str(args.chunks),
                              "--queries", str(args.queries)], capture_output=True, text=True, check=True)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    head = (f"{'embedder':<10} {'load s':>7} {'RSS base':>9} {'+model MB':>9} {'peak MB':>8} {'chunks':>6} "
            f"{'tokens':>7} {'index s':>8} {'ms/1k tok':>9} {'100k-token session s':>20} {'query p50 ms':>12} "
            f"{'max ms':>7} {'load':>5}")
    print(head)
    print("-" * len(head))
    for r in rows:
        per_1k = 1000 * r["index_s"] / (r["tokens"] / 1000)
        print(f"{r['embedder']:<10} {r['load_s']:>7.2f} {r['rss_base_mb']:>9.0f} "
              f"{r['rss_loaded_mb'] - r['rss_base_mb']:>9.0f} {r['rss_peak_mb']:>8.0f} {r['chunks']:>6} "
              f"{r['tokens']:>7} {r['index_s']:>8.2f} {per_1k:>9.1f} {per_1k * 100 / 1000:>20.1f} "
              f"{r['query_p50_ms']:>12.2f} {r['query_max_ms']:>7.1f} {r['load_avg']:>5.1f}")
    print(f"machine: {os.cpu_count()} cores; tokens counted with MiniLM's WordPiece tokenizer for both")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
