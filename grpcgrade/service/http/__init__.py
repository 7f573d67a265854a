"""The HTTP faces (`--http-port`): each trainer's or API's own protocol, one module per protocol, all on one
port and all translating to the same engine call (`common.FaceContext.grade`).

- `openrlhf`: OpenRLHF's remote reward model, `POST /get_reward` and `/rewards/NAME/get_reward`.
- `openai_graders`: OpenAI's `POST /v1/fine_tuning/alpha/graders/{run,validate}`.
- `common`: auth, body reading, the reward guard, the engine call, the `face` metric label.
- `slime`, `nemo_gym`: slime's remote reward model and NeMo Gym's `/verify`.
- `app`: the aiohttp application holding them (`build_http_app`).
- `limits`: what bounds a hostile client (bodies, parsing, connections).
- `forward`: the face processes' way to the engine's process (`service.link.EngineLink`, failures in HTTP's
  words). The face processes themselves (`service.face_process`), their supervisor (`service.faces`) and
  their counters (`service.counters`) serve the gRPC face too, and live in `service/`.
"""

from .app import build_http_app

__all__ = ["build_http_app"]
