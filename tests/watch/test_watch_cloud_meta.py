"""Shared pieces of the Alibaba/Tencent actions: metadata, endpoints, error lines."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cloud_fakes import ALI_SECRET, Metadata, start_metadata, use_alibaba_env
from watch_helpers import free_port

from gpuplan.errors import ActionError, MonitorError
from gpuplan.monitor.cloud_meta import (
    ALIBABA,
    TENCENT,
    instance_metadata,
    parse_endpoint,
    sdk_error,
)


def test_parse_endpoint() -> None:
    assert parse_endpoint("http://127.0.0.1:8080", "--x") == ("http", "127.0.0.1:8080")
    assert parse_endpoint("https://ecs.cn-hangzhou.aliyuncs.com/", "--x") == (
        "https",
        "ecs.cn-hangzhou.aliyuncs.com",
    )
    assert parse_endpoint("cvm.tencentcloudapi.com", "--x") == ("https", "cvm.tencentcloudapi.com")
    for bad in ("ftp://host", "http://", "http://h/path", "http://u:p@h", "http://h:99999", ""):
        with pytest.raises(MonitorError, match="--x"):
            parse_endpoint(bad, "--x")


def test_alibaba_normal_mode_metadata_needs_no_token() -> None:
    meta = Metadata(
        pages={
            "/latest/meta-data/instance-id": "i-bp67acfmxazb4ph0abcd",
            "/latest/meta-data/region-id": "cn-shanghai",
        }
    )
    server = start_metadata(meta)
    try:
        assert instance_metadata(ALIBABA, meta.url) == ("i-bp67acfmxazb4ph0abcd", "cn-shanghai")
    finally:
        server.shutdown()
        server.server_close()


def test_metadata_failures_are_action_errors_within_the_timeout() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ActionError, match="cannot read Tencent Cloud instance metadata"):
        instance_metadata(TENCENT, url, timeout_s=0.5)
    assert time.monotonic() - started < 5
    # Not this cloud: an EC2 id from the metadata service, or a missing page.
    meta = Metadata(
        pages={
            "/latest/meta-data/instance-id": "i-0123456789abcdef0",
            "/latest/meta-data/placement/region": "us-east-1",
        }
    )
    server = start_metadata(meta)
    try:
        with pytest.raises(ActionError, match="not an instance id of Tencent Cloud"):
            instance_metadata(TENCENT, meta.url)
        with pytest.raises(ActionError, match="HTTP Error 404"):
            instance_metadata(ALIBABA, meta.url)
    finally:
        server.shutdown()
        server.server_close()


def test_sdk_error_is_one_line_and_scrubs_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", ALI_SECRET)

    class Boom(Exception):
        code = "SignatureDoesNotMatch"
        message = f"bad signature\nstring to sign used {ALI_SECRET}"

    line = sdk_error(Boom())
    assert line.startswith("SignatureDoesNotMatch: bad signature") and "\n" not in line
    assert ALI_SECRET not in line and "***" in line
    assert sdk_error(OSError("refused")) == "OSError: refused"


def test_alibaba_without_any_credential_is_a_failed_result(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("alibabacloud_ecs20140526")
    from gpuplan.monitor.actions import ActionContext
    from gpuplan.monitor.alibaba import AlibabaStopAction

    use_alibaba_env(monkeypatch, None, None, home=str(tmp_path))
    action = AlibabaStopAction(
        instance_id="i-bp67acfmxazb4ph0abcd",
        region="cn-hangzhou",
        endpoint=f"http://127.0.0.1:{free_port()}",
    )
    result = action.run(ActionContext(reason="r"), execute=True)
    assert not result.ok and "\n" not in result.detail
    assert "StopInstances" in result.detail and "credentials" in result.detail
