"""``rlft serve-reward``: serve rlft rewards over HTTP for ``type: http`` (see :mod:`rlft.rewards.server`).

rlft serve-reward --reward-config rewards.yaml [--host 127.0.0.1] [--port 8001] [--token T]
"""

from __future__ import annotations

import os
import sys

from rlft.errors import UsageError


def add_arguments(p) -> None:
    p.add_argument("--reward-config", required=True, help="YAML with a reward: section (or a whole run config).")
    p.add_argument("--host", default="127.0.0.1", help="Address to listen on (default loopback only).")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument(
        "--token",
        default=os.environ.get("RLFT_REWARD_TOKEN"),
        help="Bearer token clients must send (default $RLFT_REWARD_TOKEN); required off loopback.",
    )


def run(args) -> int:
    from rlft.cli.serve import require_service_packages
    from rlft.service.security import is_loopback

    require_service_packages("serve-reward", ("fastapi", "uvicorn"))

    if not is_loopback(args.host) and not args.token:
        raise UsageError(
            f"refusing to listen on {args.host} without --token: the reward server runs reward code "
            f"for whoever can reach it"
        )
    import uvicorn

    from rlft.rewards.server import create_reward_app, load_reward_config

    reward = load_reward_config(args.reward_config)
    app = create_reward_app(reward, token=args.token)
    print(
        f"rlft serve-reward: POST http://{args.host}:{args.port}/score ({', '.join(f.type for f in reward.functions)})",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", server_header=False)
    return 0
