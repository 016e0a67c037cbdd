"""The "Use with vLLM" page's configurations are ones vLLM and the connector accept: each JSON
block builds a ``KVTransferConfig`` and its ``kv_connector_extra_config`` a kvstore
configuration, and the daemon's TOML has the layout the daemon-mode test runs with. Its shell
and Python blocks run in order, as a user types them, in vLLM's default process layout (no
environment variable set)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from bench.vllm_engines import BLOCK_SIZE
from connector.vllm import load_kvstore_config
from kvstore.config import load_config
from kvstore.layout import KVLayout
from tests.docs_pages import page
from tests.vllm.test_vllm_daemon import VLLM_LAYOUT

SECTION = page("vllm")
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)


def _blocks(lang: str) -> list[str]:
    return [m[2] for m in FENCE.finditer(SECTION) if m[1] == lang]


@pytest.mark.parametrize("text", _blocks("json"), ids=["in-process", "daemon"])
def test_json_blocks_are_accepted(text: str) -> None:
    from vllm.config import KVTransferConfig

    block: dict[str, Any] = json.loads(text)
    tcfg = KVTransferConfig(**block)
    assert (tcfg.kv_connector, tcfg.kv_connector_module_path) == ("KVStoreConnector",
                                                                  "connector.vllm")
    extra = {k: v for k, v in block["kv_connector_extra_config"].items() if k != "config_file"}
    cfg = load_kvstore_config(extra, KVLayout(2, 2, 32, BLOCK_SIZE, "float32", "vllm-cpu"), "m")
    assert cfg.tenant_salt == "team-a"


def test_daemon_toml_has_the_tested_vllm_layout(tmp_path: Path) -> None:
    (text,) = _blocks("toml")
    path = tmp_path / "kvstore-vllm.toml"
    path.write_text(text)
    assert load_config(path).layout.build() == KVLayout(**VLLM_LAYOUT)  # type: ignore[arg-type]


def test_the_sections_blocks_run_in_order_in_the_default_layout(tmp_path: Path) -> None:
    from tests.test_readme import file_name
    from tests.test_readme_daemon import SHELL, run_sections

    for text in _blocks("toml"):  # the TOML the section says to save
        (tmp_path / str(file_name(text))).write_text(text)
    code = [(m[1], m[2]) for m in FENCE.finditer(SECTION) if m[1] in (*SHELL, "python")]
    assert [lang for lang, _ in code] == ["python", "bash", "python", "bash"]
    # vLLM's default layout
    session = run_sections(tmp_path, blocks=code,
                           env_drop=("VLLM_ENABLE_V1_MULTIPROCESSING",))
    out = "".join(session.transcript)
    assert "3968 prompt tokens loaded from the daemon; same tokens: True" in out, out
    assert "It prints `3968 prompt tokens loaded from the daemon; same tokens: True`" in SECTION
