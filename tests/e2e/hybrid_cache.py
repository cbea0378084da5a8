#!/usr/bin/env python3
"""The prefix cache of a hybrid model (tiny-qwen3_5: gated DeltaNet, its recurrent state kept as
snapshots) through the official `openai` SDK.

    hybrid_cache.py URL

- the same prompt asked twice (greedy): the second answer equals the first, and
  `usage.prompt_tokens_details.cached_tokens` equals the prompt (reused whole: its state and
  last logits kept at its end);
- streaming the repeated prompt gives the same text;
- a second turn that extends the first (prompt + answer + more): at least the first prompt
  cached, and the same answer as the turn asked again cold, after 40 other prompts have pushed
  its snapshots out of the pool (then nothing is cached).
Exits non-zero on any failure.
"""
import argparse
from openai import OpenAI

from common import check, finish


def cached(usage):
    d = getattr(usage, "prompt_tokens_details", None)
    return (d.cached_tokens if d is not None else 0) or 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    a = ap.parse_args()
    c = OpenAI(base_url=a.url, api_key="none")
    model = c.models.list().data[0].id
    prompt = ("The lighthouse keeper counted the ships that passed each night, writing their "
              "names in a book that nobody else would ever read. ") * 3
    ask = dict(model=model, prompt=prompt, max_tokens=12, temperature=0)
    r1 = c.completions.create(**ask)
    r2 = c.completions.create(**ask)
    n = r2.usage.prompt_tokens
    check("the same prompt again: the same answer", r1.choices[0].text == r2.choices[0].text,
          f"{r1.choices[0].text!r} vs {r2.choices[0].text!r}")
    check("the same prompt again: cached_tokens equals the prompt", cached(r2.usage) == n,
          f"{cached(r2.usage)} of {n}")
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(**ask, stream=True)
                       if ch.choices)
    check("streamed, the same prompt again: the same text", streamed == r1.choices[0].text,
          f"{streamed!r} vs {r1.choices[0].text!r}")

    turn2 = prompt + r1.choices[0].text + " The next morning"
    t2 = c.completions.create(model=model, prompt=turn2, max_tokens=12, temperature=0)
    check("a second turn resumes at the first prompt's end", cached(t2.usage) >= n,
          f"{cached(t2.usage)} cached, first prompt {n}")
    # other prompts push the turn's snapshots out of the pool (20 slots at most): then the turn
    # runs cold (nothing cached) and must answer the same
    for i in range(40):
        c.completions.create(model=model, prompt=f"{i} unrelated words {i * 7} " * 4, max_tokens=1,
                             temperature=0)
    cold = c.completions.create(model=model, prompt=turn2, max_tokens=12, temperature=0)
    check("the second turn cold (its snapshots evicted: nothing cached): the same answer",
          cold.choices[0].text == t2.choices[0].text and cached(cold.usage) == 0,
          f"{cold.choices[0].text!r} vs {t2.choices[0].text!r} ({cached(cold.usage)} cached)")
    finish("hybrid_cache.py")


if __name__ == "__main__":
    main()
