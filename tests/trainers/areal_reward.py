"""Run by .venv-trainers' Python (areal 1.0.4 without its dependencies): AReaL's own `AsyncRewardWrapper`
runs `RewardFunction` in its process pool with the call AReaL's RLVR workflow makes
(`reward_fn(prompt, completions, prompt_ids, completion_ids, **task_data)`, areal/workflow/rlvr.py).
Standard input: {"target", "token", "reward", "rows": [{"prompt", "completion", "completion_ids", "answer"}]};
prints one JSON object: each row's reward, or the error the wrapper raised.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
import types

# areal/__init__.py imports its whole training stack (torch, flask...); the reward API needs none of it,
# so the package is entered without running its __init__ (docs/trainers.md, AReaL).
spec = importlib.util.find_spec("areal")
assert spec is not None and spec.submodule_search_locations is not None
package = types.ModuleType("areal")
package.__path__ = list(spec.submodule_search_locations)
sys.modules["areal"] = package

from areal.api.reward_api import AsyncRewardWrapper  # noqa: E402

from grpcgrade.integrations.areal import RewardFunction  # noqa: E402


async def main(args: dict) -> dict:
    fn = RewardFunction(args["target"], args["reward"], token=args["token"])
    wrapper = AsyncRewardWrapper(fn, max_workers=1, max_retries=1)
    out = []
    for row in args["rows"]:
        try:
            reward = await wrapper(
                row["prompt"], row["completion"], [1, 2, 3], row["completion_ids"], answer=row["answer"], level=1
            )
            out.append({"reward": reward})
        except Exception as exc:  # what AReaL's workflow receives: the rollout is rejected
            out.append({"error": f"{type(exc).__name__}: {exc}"})
    return {"results": out}


print(json.dumps(asyncio.run(main(json.loads(sys.stdin.read())))))
