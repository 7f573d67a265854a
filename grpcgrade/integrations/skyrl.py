"""SkyRL's environments (skyrl-gym 0.4): a text environment whose reward comes from a grpcgrade server.

SkyRL's generator makes one environment per prompt (`skyrl_gym.make(env_class, env_config=...,
extras=row)`: the dataset row's `reward_spec`, `extra_info`...), calls `init(prompt)` with the chat and then
`step(action)` with the model's text; `step` returns `BaseTextEnvStepOutput` (`observations`, `reward`,
`done`, `metadata`). `GrpcgradeEnv` grades the action as one sample: `query` the prompt's last user
message, `response` the action, `reference` the row's `reward_spec.ground_truth`, `extra` the row's
`extra_info`; it answers `done=True` (single turn). Subclass it and call `grade(action)` from your own
`step` for a multi-turn environment.

Configuration (`env_config`, SkyRL's `environment.skyrl_gym.<env_class>` section): `target` (host:port),
`reward` (a reward configured on the server), `token`, `timeout`, `failure_reward`.

A failed sample (its graders failed): SkyRL takes the step's number as the reward and has no mask, so the
step answers `failure_reward` (0.0 unless configured) with `metadata["grpcgrade_failed"] = True` and the
cause in `metadata["grpcgrade_error"]`; `get_metrics()` reports `grpcgrade_failed` (0.0 or 1.0), which
SkyRL averages over episodes into its logged environment metrics, and the failure is logged. A call that
fails as a whole (server unreachable, unknown reward) raises: SkyRL must not train on rewards nobody
computed. SkyRL sends no token counts: a reward that gates on one (`completion_length_cap`) needs the server's
tokenizer (`--tokenizer`), or a `completion_tokens` in the row's `extra_info`; without either the environment
refuses to be built (ValueError naming `--tokenizer`) rather than cut every reward to the gate's `min_reward`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

from grpcgrade.client import UnsendableSample
from grpcgrade.integrations.common import (
    failure_of,
    field,
    last_text,
    log,
    require_counts,
    reward_of,
    shared_client,
    unsent_result,
    usable_extra,
)

#: The id `register()` gives the environment (`environment.env_class` in SkyRL's configuration).
ENV_ID = "grpcgrade"
#: metadata / metrics key of the failure flag.
FAILED_KEY = "grpcgrade_failed"


def _setting(config: Any, name: str, default: Any) -> Any:
    if config is None:
        return default
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)  # an OmegaConf node


class GrpcgradeEnv(BaseTextEnv):
    """A single-turn text environment graded by a grpcgrade reward (module docstring)."""

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        extras = extras or {}
        self.target = str(_setting(env_config, "target", "127.0.0.1:50051"))
        self.reward_name = str(_setting(env_config, "reward", ""))
        if not self.reward_name:
            raise ValueError("grpcgrade: env_config.reward is required (a reward configured on the server)")
        token = _setting(env_config, "token", None)
        timeout = float(_setting(env_config, "timeout", 60.0))
        self.client = shared_client(self.target, token, timeout)
        self.failure_reward = float(_setting(env_config, "failure_reward", 0.0))
        spec = extras.get("reward_spec") or {}
        self.reference = field("reference", spec.get("ground_truth") if isinstance(spec, Mapping) else None)
        info = extras.get("extra_info") or {}
        self.extra = usable_extra(info.items()) if isinstance(info, Mapping) else {}
        if "completion_tokens" not in self.extra:  # a count in the row's extra_info reaches the gate
            require_counts(self.target, token, timeout, self.reward_name, "SkyRL's environment")
        self.query = ""
        self.failed = False

    def init(self, prompt: Any) -> tuple[Any, dict[str, Any]]:
        self.query = last_text(prompt, "user")
        return prompt, {}

    def grade(self, action: str) -> tuple[float, dict[str, Any]]:
        """The action's reward and the step's metadata (the failure value and flag when its graders failed)."""
        sample = {"query": self.query, "response": action, **self.reference, **self.extra}
        try:
            result = self.client.evaluate(sample, reward=self.reward_name)
        except UnsendableSample as exc:
            result = unsent_result(exc)
        value = reward_of(result)
        self.failed = value is None
        if value is None:
            why = failure_of(result)
            log.warning("grpcgrade: a SkyRL step's graders failed (%s); its reward is %s", why, self.failure_reward)
            return self.failure_reward, {FAILED_KEY: True, "grpcgrade_error": why}
        return value, {FAILED_KEY: False}

    def step(self, action: str) -> BaseTextEnvStepOutput:
        reward, metadata = self.grade(action)
        return BaseTextEnvStepOutput(observations=[], reward=reward, done=True, metadata=metadata)

    def get_metrics(self) -> dict[str, Any]:
        return {FAILED_KEY: float(self.failed)}


def register(env_id: str = ENV_ID) -> None:
    """Registers `GrpcgradeEnv` with skyrl-gym under `env_id` (SkyRL's `environment.env_class`)."""
    from skyrl_gym.envs.registration import register as skyrl_register

    skyrl_register(id=env_id, entry_point="grpcgrade.integrations.skyrl:GrpcgradeEnv")
