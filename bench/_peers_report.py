"""bench_peers' table: each case's rounds summed up, one row a case, ratios to the peers."""

from __future__ import annotations

import numpy as np

from _harness import pct


def summary(case) -> dict:
    """req/s over all rounds; p50: the median round's; p99: the worst round's; req per
    CPU-second of the server's processes (how well its work scales with cores)."""
    n = sum(r["n"] for r in case.rounds)
    elapsed = sum(r["elapsed"] for r in case.rounds)
    cpu = sum(r["cpu"] for r in case.rounds)
    return {"rps": n / elapsed if elapsed else float("nan"),
            "rounds": [r["n"] / r["elapsed"] for r in case.rounds],
            "p50": float(np.median([r["p50"] for r in case.rounds])) if case.rounds else float("nan"),
            "p99": max((r["p99"] for r in case.rounds), default=float("nan")),
            "per_cpu": n / cpu if cpu and cpu == cpu else float("nan"),
            "cores_busy": cpu / elapsed if elapsed else float("nan"),
            "non200": sum(r["non200"] for r in case.rounds), "errors": sum(r["errors"] for r in case.rounds),
            "ping_p99": pct([ms for r in case.rounds for ms in r["pings"]], 99),
            "ping_failures": sum(r["ping_failures"] for r in case.rounds)}


def ratio(a: float, b: float | None) -> str:
    return f"{a / b:5.2f}x" if b else "    -"


def report(cases: list, title: str, notes: list[str], baselines: dict[str, tuple], ping_period_s: float) -> None:
    """One table; `baselines` names the columns of ratios: title -> (server, protocol), a
    protocol of None meaning each row's own (the same server at an earlier commit)."""
    print()
    print(title)
    for note in notes:
        print(note)
    stats = {(c.server, c.protocol, c.batch): summary(c) for c in cases}
    width = max([len("server, protocol")] + [len(c.label) for c in cases])
    header = (f"{'server, protocol':{width}} {'batch':>5} {'req/s':>7} {'per round':>15} {'p50 ms':>7} {'p99 ms':>7} "
              f"{'cores':>5} {'req/cpu-s':>9} {'non-200':>8} {'ping p99':>8} "
              + " ".join(f"{'vs ' + name:>10}" for name in baselines) + "  answer")
    print(header)
    print("-" * len(header))
    for c in cases:
        s = stats[(c.server, c.protocol, c.batch)]
        per_round = "/".join(f"{v:.0f}" for v in s["rounds"])
        bad = f"{s['non200']}" + (f"+{s['errors']}e" if s["errors"] else "")
        vs = " ".join(f"{ratio(s['rps'], stats.get((server, protocol or c.protocol, c.batch), {}).get('rps')):>10}"
                      for server, protocol in baselines.values())
        ping = "-" if s["ping_p99"] != s["ping_p99"] else f"{s['ping_p99']:.0f}" + (
            f"+{s['ping_failures']}f" if s["ping_failures"] else "")
        print(f"{c.label:{width}} {c.batch:5} {s['rps']:7.0f} {per_round:>15} {s['p50']:7.1f} {s['p99']:7.1f} "
              f"{s['cores_busy']:5.2f} {s['per_cpu']:9.0f} {bad:>8} {ping:>8} {vs}  {c.correct}")
    print("req/s: all rounds together; per round: each round's req/s; p50: the median round's, p99: the worst "
          "round's;\ncores: the server's CPU-seconds per second (all its processes); req/cpu-s: requests per "
          "CPU-second of the server;\nnon-200: answers that were not 200 (+Ne: connection errors); ping p99: our "
          f"server's /ping, GET every {ping_period_s * 1000:.0f} ms during the load, all rounds (+Nf: not 200 within "
          "2 s);\nvs X: req/s over X's at the same batch; answer: the check before the load.")
