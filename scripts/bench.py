"""Benchmarks (placeholder until the readout-speed issue fills it).

Prints, side by side in one run, the readout throughput of the Transformers
engine on the tiny model for single-token (yes/no) and multi-token (0-100)
options, and the prefix reuse of the trie (tokens computed vs tokens a
one-sequence-per-option scorer would compute). Numbers are measured, never
asserted.
"""

from __future__ import annotations

import json
import os
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    from engines.hf import HFEngine, HFSettings
    from experiments.yesno import YesNoSpec, expand
    from probe.types import Message, Trial

    engine = HFEngine(HFSettings(model="tiny", batch_size=16)).load()
    trials = expand(YesNoSpec(), count_tokens=engine.count_tokens)
    scale = tuple(str(i) for i in range(101))
    graded = [
        Trial(
            f"g{i}",
            "bench",
            t.item_id,
            {},
            (
                Message(
                    "user",
                    t.messages[-1].content.rsplit("\n\n", 1)[0]
                    + "\n\nHow acceptable is it, on a scale from 0 to 100? Answer with a number only.",
                ),
            ),
            scale,
            scale,
        )
        for i, t in enumerate(trials[::12])
    ]
    report = {}
    for name, batch in (("yesno", trials), ("graded_0_100", graded)):
        t0 = time.perf_counter()
        rs = engine.readout(batch)
        dt = time.perf_counter() - t0
        computed = sum(r.computed_tokens for r in rs)
        naive = sum(r.prompt_tokens * len(r.scores) + sum(len(s.token_ids) for s in r.scores) for r in rs)
        report[name] = {
            "trials": len(batch),
            "seconds": round(dt, 3),
            "trials_per_s": round(len(batch) / dt, 2),
            "tokens_computed": computed,
            "tokens_one_sequence_per_option": naive,
            "reuse_ratio": round(naive / computed, 2),
        }
        print(
            f"{name:>14}: {len(batch)} trials in {dt:.2f}s = {len(batch) / dt:.1f} trials/s; "
            f"computed {computed} tokens vs {naive} for one sequence per option ({naive / computed:.1f}x less)"
        )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
