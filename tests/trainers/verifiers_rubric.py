"""Run by .venv-trainers' Python (verifiers 0.3.1): verifiers' own `Rubric.score_group` and `score_rollout`
score premade rollouts (`vf.State`, no model) with `grpcgrade.integrations.verifiers.rubric`.
Standard input: {"target", "token", "reward", "rows": [{"question", "completion", "answer"}]}; prints one
JSON object: each state's reward and metrics, from a group and from one rollout at a time; and, from
one rollout scored per `asyncio.run` (a loop a step, as a script driving verifiers may), this process's
connections to the server opened while each loop ran and left once it had ended (`loops`).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time

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


def connections(port: int) -> int:
    """This process's TCP connections to `port` (grpcgrade.testing's `connections_to` needs the server's
    packages, which this venv has not)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=int(fd))  # the socket's own family and type
            try:
                count += sock.family in (socket.AF_INET, socket.AF_INET6) and sock.getpeername()[1] == port
            finally:
                sock.detach()  # the fd stays its owner's
        except OSError:  # closed meanwhile, or not connected
            continue
    return count


def loops(args: dict, runs: int = 3) -> list[tuple[int, int]]:
    """This process's connections to the server beyond those it held before (`rubric` keeps the shared
    client it asked the server's catalog with), while each run's loop ran and once it ended (waited for up
    to 10 s)."""
    scorer = rubric(args["target"], args["reward"], token=args["token"])
    port = int(args["target"].rsplit(":", 1)[1])
    before = connections(port)

    async def one() -> int:
        await scorer.score_rollout(state(args["rows"][0]))
        return connections(port) - before

    out = []
    for _ in range(runs):
        during = asyncio.run(one())
        end = time.monotonic() + 10
        while connections(port) > before and time.monotonic() < end:
            time.sleep(0.05)
        out.append((during, connections(port) - before))
    return out


args = json.loads(sys.stdin.read())
counted = loops(args)  # first: a loop's client left open would hold a connection the later ones share
print(json.dumps({**asyncio.run(main(args)), "loops": counted}))
