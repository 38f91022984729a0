"""Two characters on one Mistral base: unmerged LoRA at run time against a merge/unmerge on every switch.

    python benchmarks/character_switch.py                      # a mid-size MLLM on the CPU (about a minute)
    python benchmarks/character_switch.py --size full --device cuda

Prints, measured in one run on random weights (labelled so): the MLLM forward over a prompt of
560 tokens (about two past turns) with the LoRA applied by hooks against the same weights merged;
the time of one character switch in each mode; and what 100 switches leave in the shared bf16
weights when each switch folds ``s * B @ A`` in and out (unmerged switching never writes them).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from worker.pipeline.characters import SharedMLLM, lora_targets, random_parts
from worker.pipeline.config import MLLMConfig, full
from worker.pipeline.mllm import AnimeGamerMLLM
from worker.pipeline.tokenizer import added_token_names

PROMPT_TOKENS = 560
SWITCHES = 100
MID = MLLMConfig(hidden_size=1024, num_layers=8, num_heads=8, num_kv_heads=2, intermediate_size=3584)


def timed(fn, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=("mid", "full"), default="mid")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device = torch.device(args.device)
    config = full().mllm if args.size == "full" else replace(MID)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    vocab = config.base_vocab_size + len(added_token_names())

    torch.manual_seed(0)
    with torch.device(device):
        mllm = AnimeGamerMLLM(config, vocab, 1920).to(dtype).eval()
    parts = {"Qiqi": random_parts(mllm, 1), "Sosuke": random_parts(mllm, 2)}
    ids = torch.randint(0, vocab, (1, PROMPT_TOKENS), device=device)
    print(f"MLLM {config.hidden_size} wide, {config.num_layers} layers, {dtype} on {device}; random weights")

    def forward() -> None:
        with torch.no_grad():
            mllm.llm(input_ids=ids, logits_to_keep=1)

    # 1. The forward pass, alternating the two modes so the machine's noise falls on both alike.
    shared = SharedMLLM(mllm, parts)
    forward()  # warm-up
    times: dict[str, list[float]] = {"unmerged": [], "merged": []}
    logits = {}
    for _ in range(args.repeats):
        for mode in ("unmerged", "merged"):
            shared.set_mode(mode)
            times[mode].append(timed(forward, device))
            with torch.no_grad():
                logits[mode] = mllm.llm(input_ids=ids, logits_to_keep=1).logits.float()
    unmerged_forward, merged_forward = (statistics.median(times[m]) for m in ("unmerged", "merged"))

    # 2. One switch in each mode.
    switch = {}
    for mode in ("unmerged", "merged"):
        shared.set_mode(mode)
        names = ["Sosuke", "Qiqi"] * 5
        switch[mode] = statistics.median(timed(lambda n=name: shared.use(n), device) for name in names)

    # 3. What switching merged leaves in the shared weights, in bf16 (how they are served on a GPU).
    drift = merged_drift(config, vocab)

    print(f"\n{'':34}{'unmerged (chosen)':>20}{'merge/unmerge':>16}")
    print(f"{'MLLM forward, 560 tokens':34}{unmerged_forward * 1e3:>17.1f} ms{merged_forward * 1e3:>13.1f} ms")
    print(f"{'one character switch':34}{switch['unmerged'] * 1e3:>17.3f} ms{switch['merged'] * 1e3:>13.1f} ms")
    changed = f"{(drift > 0).float().mean():.1%} of values"
    print(f"{f'base changed by {SWITCHES} switches (bf16)':34}{'none (never written)':>20}{changed:>16}")
    print(
        f"\nforward ratio unmerged/merged: {unmerged_forward / merged_forward:.2f}x (one run, median of {args.repeats})"
    )
    print(f"largest change to a bf16 base value by switching merged: {drift.max():.2e}")
    gap = (logits["unmerged"] - logits["merged"]).abs().max()
    print(f"unmerged vs merged logits, same character: max |diff| {gap:.2e}")


def merged_drift(config: MLLMConfig, vocab: int) -> torch.Tensor:
    """|W - W0| of the first layer's projections after SWITCHES merged round trips ending where they began."""
    small = replace(config, num_layers=1)
    torch.manual_seed(0)
    mllm = AnimeGamerMLLM(small, vocab, 1920).to(torch.bfloat16).eval()
    shared = SharedMLLM(mllm, {"Qiqi": random_parts(mllm, 1), "Sosuke": random_parts(mllm, 2)}, mode="unmerged")
    before = [mllm.get_submodule(path).weight.detach().clone() for path in lora_targets(mllm)]
    shared.set_mode("merged")
    for _ in range(SWITCHES // 2):
        shared.use("Sosuke")
        shared.use("Qiqi")
    shared.set_mode("unmerged")  # folds Qiqi out: the weights should be the base again
    after = [mllm.get_submodule(path).weight.detach() for path in lora_targets(mllm)]
    return torch.cat([(a.float() - b.float()).abs().flatten() for a, b in zip(after, before, strict=True)])


if __name__ == "__main__":
    main()
