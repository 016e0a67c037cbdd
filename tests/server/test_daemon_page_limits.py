"""The daemon's per-namespace quota and per-session staging area, in pages: a size under one
page is refused at start naming the field (it would refuse every save), larger ones round down
to whole pages, and a staging area is capped at the host slab."""

from __future__ import annotations

import pytest

from kvstore.config import DaemonConfig
from kvstore.errors import ConfigError
from server.daemon.app import page_limits

PAGE = 1 << 20


def test_unset_means_no_quota_and_a_slab_sized_staging_area() -> None:
    assert page_limits(DaemonConfig(), PAGE, 64) == (None, 64)


def test_sizes_round_down_to_pages_and_staging_is_capped_at_the_slab() -> None:
    dcfg = DaemonConfig(namespace_quota="3.5MiB", staging_bytes="1GiB")
    assert page_limits(dcfg, PAGE, 64) == (3, 64)
    assert page_limits(DaemonConfig(staging_bytes="2MiB"), PAGE, 64) == (None, 2)


@pytest.mark.parametrize("field", ["namespace_quota", "staging_bytes"])
def test_less_than_one_page_is_refused_naming_the_field(field: str) -> None:
    with pytest.raises(ConfigError, match=f"daemon.{field} is 1024 bytes, less than one page "
                                          f"\\({PAGE} bytes"):
        page_limits(DaemonConfig(**{field: "1KiB"}), PAGE, 64)
