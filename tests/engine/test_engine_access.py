"""Reaching an SGLang someone already runs: its API key, TLS with a private CA, its model name.

The engine is the SGLang emulator's HTTP app under uvicorn on a real port, started with an API
key as SGLang's `--api-key`, and over TLS with a certificate signed by a CA made here with the
`openssl` command.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from inference_auctions.server.emulator.live import LiveSimulator
from inference_auctions.server.emulator.sglang_app import create_sglang_app
from inference_auctions.server.emulator.simulator import EngineSimulator
from inference_auctions.server.engine.errors import EngineRejected, EngineUnavailable
from inference_auctions.server.engine.protocol import EngineRequest
from inference_auctions.server.engine_choice import engine_ssl_context, make_engine
from tests.engine.conftest import serve, started_engine

pytestmark = pytest.mark.anyio

ENGINE_KEY = "sk-engine-secret-0123456789"


def _request(rid: str) -> EngineRequest:
    return EngineRequest(rid=rid, input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 2})


def _engine_app(api_key: str | None = None, model_name: str = "org/served-model") -> object:
    live = LiveSimulator(EngineSimulator(), time_scale=0.001, model_name=model_name)
    return create_sglang_app(live, api_key=api_key)


async def test_the_engine_key_is_sent_as_sglang_expects_and_never_shown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    with serve(_engine_app(api_key=ENGINE_KEY)) as url:
        async with started_engine(url, api_key=ENGINE_KEY) as engine:
            result = await engine.generate(_request("with-key"))
            assert result.meta_info["completion_tokens"] == 2
        wrong = "sk-wrong-key-9876543210"
        for key in (None, wrong):
            async with started_engine(url, api_key=key) as engine:
                with pytest.raises(EngineRejected) as refused:
                    await engine.generate(_request("without-key"))
                assert refused.value.engine_status == 401
                assert ENGINE_KEY not in str(refused.value)
                assert wrong not in str(refused.value)
    assert ENGINE_KEY not in caplog.text and "sk-wrong" not in caplog.text


def _openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


def _certificate_authority(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", f"/CN={name}", "-keyout", key, "-out", cert,
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return key, cert


def _server_certificate(folder: Path, ca_key: Path, ca_cert: Path) -> tuple[Path, Path]:
    key, request, cert = folder / "engine.key", folder / "engine.csr", folder / "engine.pem"
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", key, "-out", request,
    )  # fmt: skip
    extensions = folder / "san.cnf"
    extensions.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "x509", "-req", "-in", request, "-CA", ca_cert, "-CAkey", ca_key,
        "-CAcreateserial", "-days", "2", "-out", cert, "-extfile", extensions,
    )  # fmt: skip
    return key, cert


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A test CA, an engine certificate it signed for 127.0.0.1, and an unrelated CA."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is needed to make the test CA")
    folder = tmp_path_factory.mktemp("tls")
    ca_key, ca_cert = _certificate_authority(folder, "test-ca")
    _, other_ca = _certificate_authority(folder, "other-ca")
    key, cert = _server_certificate(folder, ca_key, ca_cert)
    yield {"ca": ca_cert, "other_ca": other_ca, "key": key, "cert": cert}


async def test_an_https_engine_is_checked_against_the_ca_bundle(
    tls_files: dict[str, Path],
) -> None:
    app = _engine_app(api_key=ENGINE_KEY)
    with serve(app, ssl_certfile=str(tls_files["cert"]), ssl_keyfile=str(tls_files["key"])) as url:
        assert url.startswith("https://")
        engine = make_engine(url, api_key=ENGINE_KEY, ca_bundle=str(tls_files["ca"]))
        await engine.start()
        try:
            result = await engine.generate(_request("over-tls"))
            assert result.meta_info["completion_tokens"] == 2
        finally:
            await engine.close()
        # A certificate no trusted CA signed: refused, with the reason, before any request.
        for bundle in (str(tls_files["other_ca"]), None):
            engine = make_engine(url, api_key=ENGINE_KEY, ca_bundle=bundle)
            await engine.start()
            try:
                with pytest.raises(EngineUnavailable) as failed:
                    await engine.generate(_request("wrong-ca"))
            finally:
                await engine.close()
            message = str(failed.value)
            assert "TLS certificate" in message and "failed the check" in message, message
            assert "certificate verify failed" in message or "unable to get" in message, message
            assert ENGINE_KEY not in message


def test_a_ca_bundle_that_is_not_pem_is_refused_by_name(tmp_path: Path) -> None:
    bundle = tmp_path / "not-a-bundle.pem"
    bundle.write_text("not a certificate\n")
    with pytest.raises(ValueError, match=r"engine_ca_bundle .* cannot be read as PEM"):
        engine_ssl_context("https://127.0.0.1:1", str(bundle))
    assert engine_ssl_context("http://127.0.0.1:1", str(bundle)) is None  # plain HTTP: unused


async def test_the_model_name_is_learnt_from_the_engine_and_again_after_a_restart() -> None:
    with serve(_engine_app(model_name="org/first-model")) as url:
        async with started_engine(url) as engine:
            assert engine.model_name is None  # nothing stated yet
            assert await engine.learn_model_name() == "org/first-model"
    # The same address, now serving another model: the next /server_info read sees it.
    port = url.rsplit(":", 1)[1]
    with serve(_engine_app(model_name="org/second-model"), port=int(port)) as again:
        assert again == url
        async with started_engine(url) as engine:
            engine.model_name = "org/first-model"  # what it had learnt before the restart
            await engine.server_info()
            assert engine.model_name == "org/second-model"
