"""What the server can run: graders, the plugins behind them, and configured rewards, as one message.

The CLI's `grpcgrade graders` prints the same message, so both views always agree.
"""

from __future__ import annotations

from grpcgrade.core.registry import Registry
from grpcgrade.core.rewards import Reward
from grpcgrade.grader import GraderMode
from grpcgrade.v1 import grading_pb2 as pb

from .convert import spec_from_data
from .structs import py_to_value

_MODES = {GraderMode.POINTWISE: pb.GRADER_MODE_POINTWISE, GraderMode.LISTWISE: pb.GRADER_MODE_LISTWISE}


def list_graders(registry: Registry, rewards: dict[str, Reward]) -> pb.ListGradersResponse:
    out = pb.ListGradersResponse()
    for entry in sorted(registry.entries, key=lambda e: e.name):
        info = out.graders.add(
            name=entry.name,
            mode=_MODES[entry.mode],
            description=entry.description,
            plugin=entry.plugin.name,
            distribution=entry.plugin.distribution,
            version=entry.plugin.version,
        )
        info.aliases.extend(entry.aliases)
        for p in entry.params:
            param = info.params.add(name=p.name, type=p.type, required=p.required)
            param.default.CopyFrom(py_to_value(p.default))
    for plugin in registry.plugins:
        out.plugins.add(
            name=plugin.name,
            distribution=plugin.distribution,
            version=plugin.version,
            status=plugin.status,
            error=plugin.error,
            graders=plugin.graders,
        )
    for name, reward in sorted(rewards.items()):
        reward_info = out.rewards.add(name=name, description=reward.description)
        reward_info.graders.extend(spec_from_data(s) for s in reward.specs)
    return out
