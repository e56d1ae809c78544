"""The service config's ``providers`` section (issue 37): parsed into ProviderConfigs whose limits
reach the core; a wrong entry is a SpecError naming the file, the line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from arl_tangram.core.errors import SpecError
from arl_tangram.runtime.build import build_engine, engine_config
from arl_tangram.runtime.config import load_service_config


def test_providers_parse_and_reach_the_core_limits(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("secret-key-123\n")
    f = tmp_path / "svc.yaml"
    f.write_text(f"""
providers:
  - name: serper
    kind: search
    base_url: https://serper.example
    keys: [{{file: {tmp_path / "k"}}}]
    auth_header: X-API-KEY
    limits: {{rate_per_s: 50, burst: 50, concurrency: 16, budget: 1000}}
  - name: tavily
    base_url: https://tavily.example
    limits: {{rate_per_min: 1000}}
""")
    cfg = load_service_config(f)
    assert [p.name for p in cfg.providers] == ["serper", "tavily"]
    s = cfg.providers[0]
    assert (s.auth_header, s.auth_prefix, s.keys) == ("X-API-KEY", "", ("secret-key-123",))
    assert "secret-key-123" not in repr(cfg)
    core = engine_config(cfg).core
    assert core is not None
    lims = core.providers
    assert [(x.name, x.rate, x.burst, x.concurrency, x.budget) for x in lims] == [
        ("serper", 50.0, 50.0, 16, 1000), ("tavily", 1000 / 60, 1.0, 16, None)]
    eng = build_engine(cfg)
    assert eng.api is not None and eng.provider_calls is not None
    assert "providers" in eng.extra_stats


def test_a_missing_key_file_names_file_line_and_field(tmp_path: Path) -> None:
    f = tmp_path / "svc.yaml"
    f.write_text("""policy: tangram
providers:
  - name: serper
    base_url: https://serper.example
    keys: [{file: /nonexistent/serper.key}]
    limits: {rate_per_s: 5}
""")
    with pytest.raises(SpecError) as got:
        load_service_config(f)
    msg = str(got.value)
    assert "providers[0].keys[0].file" in msg and "cannot read the key file" in msg
    assert f"{f}:3" in msg
