"""The HTTP faces (`--http-port`): each trainer's or API's own protocol, one module per protocol, all on one
port and all translating to the same engine call (`common.FaceContext.grade`).

- `openrlhf`: OpenRLHF's remote reward model, `POST /get_reward` and `/rewards/NAME/get_reward`.
- `openai_graders`: OpenAI's `POST /v1/fine_tuning/alpha/graders/{run,validate}`.
- `common`: auth, body reading, the reward guard, the engine call, the `face` metric label.
- `app`: the aiohttp application holding them (`build_http_app`).
"""

from .app import build_http_app

__all__ = ["build_http_app"]
