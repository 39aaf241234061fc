"""``--kv-transfer-config``: vLLM's KVTransferConfig, the settings of prefill/decode
disaggregation (no torch here: the engine config imports it)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from inflight.json_config import parse_json_config

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
KV_CONNECTORS = ("GlooConnector",)


@dataclass
class KVTransferConfig:
    """Which side of a prefill/decode split this instance plays, and where its KV is served.

    ``kv_role``: ``kv_producer`` (prefill: computes the prompt and the first token,
    then keeps the request's blocks until a consumer pulls them), ``kv_consumer``
    (decode: pulls a prompt's KV from the producer named in the request's
    ``kv_transfer_params`` and computes only the last prompt token), ``kv_both``.
    ``kv_ip`` / ``kv_port``: where a producer listens for pulls (port 0: any free
    port); consumers learn it from the producer's response, so on one machine the
    defaults suffice and across machines ``kv_ip`` must be an address consumers reach.
    ``kv_connector_extra_config``: ``abort_timeout_s`` (a producer frees blocks never
    pulled after this long, vLLM's 480 s) and ``transfer_timeout_s`` (a pull that takes
    longer fails, and the consumer computes the prompt itself).
    """

    kv_connector: str = "GlooConnector"
    kv_role: str = "kv_both"
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579
    engine_id: Optional[str] = None
    kv_buffer_device: str = "cpu"
    kv_connector_extra_config: dict[str, Any] = field(default_factory=dict)

    @property
    def is_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")

    @property
    def abort_timeout_s(self) -> float:
        return float(self.kv_connector_extra_config.get("abort_timeout_s", 480.0))

    @property
    def transfer_timeout_s(self) -> float:
        return float(self.kv_connector_extra_config.get("transfer_timeout_s", 120.0))

    @classmethod
    def parse(cls, value: Any) -> Optional["KVTransferConfig"]:
        """None, a KVTransferConfig, a dict, or its JSON text (the CLI's form)."""
        cfg = parse_json_config(cls, value, "kv_transfer_config")
        if cfg is not None and cfg is not value:
            cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"kv_role must be one of {KV_ROLES}, got {self.kv_role!r}")
        if self.kv_connector not in KV_CONNECTORS:
            raise ValueError(f"kv_connector must be one of {KV_CONNECTORS}, got {self.kv_connector!r}")
        if self.kv_buffer_device != "cpu":
            raise ValueError("kv_buffer_device must be 'cpu': the Gloo connector stages blocks in host memory")
        if not 0 <= int(self.kv_port) < 65536:
            raise ValueError(f"kv_port must be in [0, 65536), got {self.kv_port}")
        if self.abort_timeout_s <= 0 or self.transfer_timeout_s <= 0:
            raise ValueError("abort_timeout_s and transfer_timeout_s must be positive")
