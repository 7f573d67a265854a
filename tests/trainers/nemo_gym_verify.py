"""Run by .venv-nemo-gym's Python (nemo-gym 0.4.0): NeMo Gym's own agent-side client and models verify
rollouts against a grpcgrade server, as `SimpleAgent.run` does (responses_api_agents/simple_agent/app.py):
`/seed_session`, then `/verify` with the run request plus the model's `response`, `raise_for_status`,
`model_validate`. Standard input (not an argument: NeMo Gym parses its command line with Hydra): a JSON
object {"host", "port", "path" (optional, "/verify" by default), "rollouts": [{"question", "text", "token_ids",
"tool_call", "agent", "expected_answer", ...task fields}]}; prints one JSON line per rollout: the validated
response's fields. An `agent` rollout is a calculator agent's turn, as `SimpleAgent.run` records it: the tool
offered, a function call, its output, then the answer.
"""

from __future__ import annotations

import asyncio
import json
import sys

from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyRequest, BaseVerifyResponse
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.openai_utils import (
    NeMoGymEasyInputMessage,
    NeMoGymFunctionCallOutput,
    NeMoGymFunctionToolParam,
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseFunctionToolCall,
    NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseOutputText,
)
from nemo_gym.server_utils import ServerClient, get_response_json, raise_for_status
from omegaconf import OmegaConf
from pydantic import ConfigDict


class TaskRunRequest(BaseRunRequest):
    """A task with its answer, as NeMo Gym's resources servers declare one (equivalence_rule's)."""

    model_config = ConfigDict(extra="allow")
    expected_answer: str


class TaskVerifyRequest(TaskRunRequest, BaseVerifyRequest):
    pass


class GrpcgradeVerifyResponse(BaseVerifyResponse):
    """BaseVerifyResponse plus the fields grpcgrade adds (pydantic ignores undeclared ones)."""

    reward_components: dict[str, float | None]
    grpcgrade_failed: int
    grpcgrade_error: str | None = None


CALC = NeMoGymFunctionToolParam(
    type="function",
    name="calc",
    description="Evaluates an arithmetic expression",
    parameters={"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    strict=True,
)


def rollout(spec: dict) -> tuple[TaskRunRequest, NeMoGymResponse]:
    params = NeMoGymResponseCreateParamsNonStreaming(
        input=[
            NeMoGymEasyInputMessage(role="system", content="Answer with a number."),
            NeMoGymEasyInputMessage(role="user", content=spec["question"]),
        ],
        tools=[CALC] if spec.get("agent") else [],
    )
    task = {k: v for k, v in spec.items() if k not in ("question", "text", "token_ids", "tool_call", "agent")}
    run = TaskRunRequest(responses_create_params=params, level="easy", **task)
    output: list = []
    if spec.get("tool_call") or spec.get("agent"):
        output.append(NeMoGymResponseFunctionToolCall(call_id="c1", name="calc", arguments='{"x": "8*9"}'))
    if spec.get("agent"):
        output.append(NeMoGymFunctionCallOutput(call_id="c1", output="72"))
    text = NeMoGymResponseOutputText(annotations=[], text=spec["text"])
    ids = spec["token_ids"]
    output.append(
        NeMoGymResponseOutputMessageForTraining(
            id="m1",
            content=[text],
            prompt_token_ids=[1, 2],
            generation_token_ids=ids,
            generation_log_probs=[0.0] * len(ids),
        )
    )
    response = NeMoGymResponse(
        id="resp_1", created_at=0, model="policy", object="response", output=output,
        parallel_tool_calls=False, tool_choice="auto", tools=[],
    )  # fmt: skip
    return run, response


async def main(args: dict) -> None:
    config = OmegaConf.create(
        {"grpcgrade": {"resources_servers": {"grpcgrade": {"host": args["host"], "port": args["port"]}}}}
    )
    client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1), global_config_dict=config)
    for spec in args["rollouts"]:
        run, response = rollout(spec)
        seeded = await client.post(server_name="grpcgrade", url_path="/seed_session", json=run.model_dump())
        await raise_for_status(seeded)
        verify_request = TaskVerifyRequest.model_validate(run.model_dump() | {"response": response.model_dump()})
        path = args.get("path", "/verify")
        verified = await client.post(server_name="grpcgrade", url_path=path, json=verify_request.model_dump())
        await raise_for_status(verified)
        answer = GrpcgradeVerifyResponse.model_validate(await get_response_json(verified))
        echoed = answer.response.output[-1].content[0].text == spec["text"]
        print(json.dumps({
            "reward": answer.reward, "reward_components": answer.reward_components,
            "grpcgrade_failed": answer.grpcgrade_failed, "grpcgrade_error": answer.grpcgrade_error, "echoed": echoed,
        }))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.stdin.read())))
