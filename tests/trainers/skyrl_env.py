"""Run by .venv-trainers' Python (skyrl-gym 0.4.0): SkyRL's own registry and base classes drive
`GrpcgradeEnv` as SkyRL's generator does (`make(env_class, env_config=..., extras=row)`, `init(prompt)`,
`step(action)`, then the class's `aggregate_metrics` over the episodes' `get_metrics()`). Standard input:
{"target", "token", "reward", "rows": [{"prompt", "action", "ground_truth"}]}; prints one JSON object.
"""

from __future__ import annotations

import json
import sys

import skyrl_gym
from skyrl_gym.envs.base_text_env import BaseTextEnv

from grpcgrade.integrations.skyrl import ENV_ID, register

args = json.loads(sys.stdin.read())
register()
config = {"target": args["target"], "token": args["token"], "reward": args["reward"], "failure_reward": -1.0}
steps, metrics = [], []
for row in args["rows"]:
    env = skyrl_gym.make(ENV_ID, env_config=config, extras={"reward_spec": {"ground_truth": row["ground_truth"]}})
    assert isinstance(env, BaseTextEnv)
    prompt = [{"role": "user", "content": row["prompt"]}]
    env.init(prompt)
    out = env.step(row["action"])
    steps.append({"reward": out["reward"], "done": out["done"], "metadata": out["metadata"]})
    metrics.append(env.get_metrics())
    env.close()
print(json.dumps({"steps": steps, "aggregated": type(env).aggregate_metrics(metrics)}))
