"""Who is calling: the user token, and per-node agent tokens minted by this controller. Pure (hmac, hashlib).

Two roles, two kinds of credential:

- **user** (people, the CLI, automation): the one bearer token of the
  controller config (`token_file` / ``$STOKE_TOKEN``). It may call every
  `StokeController` method and nothing of the `AgentGateway`.
- **agent** (one per node): a token bound to one node id,
  ``stoke-node:<node_id>:<generation>:<mac>``, where the mac is
  HMAC-SHA256 of ``stoke-node:<node_id>:<generation>`` under a secret key
  only the controller holds (kept in its database). A user mints it
  (`stoke token agent NODE`); minting again for the same node starts a new
  generation and revokes the previous token. It may call `Register` and
  `Heartbeat`, and only with its own node id: a stolen or misused agent
  token can neither take over another node's assignments nor touch
  workloads.

Tokens are compared in constant time (`hmac.compare_digest`). Verification
needs no database read per call: the generations are cached by the caller.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from dataclasses import dataclass

from foundation.names import is_name

AGENT_PREFIX = "stoke-node"


@dataclass(frozen=True)
class Identity:
    role: str  # "user" | "agent"
    node_id: str = ""  # the node an agent token is bound to


USER = Identity("user")


def _mac(key: bytes, node_id: str, generation: int) -> str:
    return hmac.new(key, f"{AGENT_PREFIX}:{node_id}:{generation}".encode(), hashlib.sha256).hexdigest()


def mint_agent_token(key: bytes, node_id: str, generation: int) -> str:
    """The token of `node_id` at `generation` (the caller checked the name and stored the generation)."""
    return f"{AGENT_PREFIX}:{node_id}:{generation}:{_mac(key, node_id, generation)}"


def agent_token_node(token: str) -> str | None:
    """The node id an agent token claims (unverified: for a default `--node-id`), or None."""
    parts = token.split(":")
    if len(parts) == 4 and parts[0] == AGENT_PREFIX and is_name(parts[1]):
        return parts[1]
    return None


class Verifier:
    """token -> `Identity` or None; `generation(node_id)` gives the node's current token generation (0 = none)."""

    def __init__(self, user_token: str, agent_key: bytes, generation: Callable[[str], int]) -> None:
        self._user = user_token.encode()
        self._key = agent_key
        self._generation = generation

    def identify(self, token: str) -> Identity | None:
        given = token.encode("utf-8", "surrogatepass")
        if hmac.compare_digest(given, self._user):
            return USER
        parts = token.split(":")
        if len(parts) != 4 or parts[0] != AGENT_PREFIX or not is_name(parts[1]):
            return None
        if not (parts[2].isascii() and parts[2].isdigit() and len(parts[2]) <= 18):
            return None
        node_id, generation = parts[1], int(parts[2])
        expected = _mac(self._key, node_id, generation).encode()
        if not hmac.compare_digest(parts[3].encode("utf-8", "surrogatepass"), expected):
            return None
        current = self._generation(node_id)
        if current == 0 or generation != current:  # never minted, or revoked by a newer one
            return None
        return Identity("agent", node_id)
