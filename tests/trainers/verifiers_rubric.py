"""Run by .venv-trainers' Python (verifiers 0.3.1): verifiers' own `Rubric.score_group` and `score_rollout`
score premade rollouts (`vf.State`, no model) with `grpcgrade.integrations.verifiers.rubric`.
Standard input: {"target", "token", "reward", "rows": [{"question", "completion", "answer"}]}; prints one
JSON object: each state's reward and metrics, from a group and from one rollout at a time.
"""

from __future__ import annotations

import asyncio
import json
import sys

import verifiers as vf

from grpcgrade.integrations.verifiers import rubric


def state(row: dict) -> vf.State:
    prompt = [{"role": "system", "content": "Answer."}, {"role": "user", "content": row["question"]}]
    completion = [{"role": "assistant", "content": row["completion"]}]
    return vf.State(prompt=prompt, completion=completion, answer=row["answer"], task="math", info={"level": 1},
                    trajectory=[])  # fmt: skip


async def main(args: dict) -> dict:
    scorer = rubric(args["target"], args["reward"], token=args["token"])
    group = [state(row) for row in args["rows"]]
    await scorer.score_group(group)
    alone = [state(row) for row in args["rows"]]
    for s in alone:
        await scorer.score_rollout(s)
    return {
        "group": [{"reward": s["reward"], "metrics": s["metrics"]} for s in group],
        "alone": [{"reward": s["reward"], "metrics": s["metrics"]} for s in alone],
    }


print(json.dumps(asyncio.run(main(json.loads(sys.stdin.read())))))
