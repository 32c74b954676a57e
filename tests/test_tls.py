"""The page over HTTPS: ``rxstream run --serve --tls-cert/--tls-key`` and
``--tls-self-signed`` serve the page and its socket over TLS (real TLS on loopback, pinned to
the printed fingerprint); bad TLS flags are one line, exit 2, before anything runs; plain http
on a host that is not loopback is warned about, and the page says why it is on JPEG.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import re
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from _serving import Served, photon_bench, texts_until

import rxstream
from rxstream import cli
from rxstream.transport import WebTransport
from rxstream.transport._tls import SelfSigned, _make, fingerprints, server_context

ROOT = Path(__file__).resolve().parent.parent
FRAMES_APP = str(Path(__file__).resolve().parent / "apps" / "frames_app.py")
SHA256 = re.compile(r"SHA-256 fingerprint ((?:[0-9A-F]{2}:){31}[0-9A-F]{2})$")
SPKI = re.compile(
    r"^rxstream run: TLS: the certificate is (\S+) \(removed at exit\); its SPKI pin, for "
    r"chromium --ignore-certificate-errors-spki-list=PIN: ([A-Za-z0-9+/]{43}=)$"
)


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, as PEM files."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    _make("127.0.0.1", cert, key)
    return cert, key


def _err(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str]:
    status = cli.main(["run", FRAMES_APP, *argv])
    return status, capsys.readouterr().err


# --- a real run over TLS --------------------------------------------------------------------


@pytest.mark.slow
def test_a_self_signed_run_serves_the_page_and_socket_over_tls(tmp_path: Path) -> None:
    """--tls-self-signed: the https page and a wss socket with the token work, pinned to the
    printed fingerprint (the served certificate's); plain http to the port or another Origin
    fail; the certificate's folder is gone at exit and the key was never left on disk."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "rxstream", "run", FRAMES_APP, "--serve", "--port", "0"]
    argv += ["--tls-self-signed", "--timeout", "60", "--set", "fps=20"]
    with subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as process:
        assert process.stderr is not None
        said: list[str] = []
        while not any("serving the page at " in line for line in said):
            line = process.stderr.readline()
            assert line, f"the run ended before it served: {said}"
            said.append(line.rstrip("\n"))
        url = said[-1].split("serving the page at ", 1)[1]
        sha256 = next(m.group(1) for m in map(SHA256.search, said) if m)
        cert, spki = next(m.groups() for m in map(SPKI.match, said) if m)
        assert url.startswith("https://127.0.0.1:")
        assert os.listdir(Path(cert).parent) == ["cert.pem"]  # the key was loaded, then removed
        assert fingerprints(cert) == (sha256, spki)
        port = int(url.split(":")[2].split("/")[0])
        token = url.split("?token=", 1)[1]
        pin = aiohttp.Fingerprint(bytes.fromhex(sha256.replace(":", "")))
        origin = f"https://127.0.0.1:{port}"

        async def check() -> None:
            async with aiohttp.ClientSession() as http:
                async with http.get(url, ssl=pin) as page:
                    assert page.status == 200
                    assert "<title>" in await page.text()
                bad = {"Origin": f"http://127.0.0.1:{port}"}  # the http origin: not this page's
                async with http.get(f"{origin}/ws?token={token}", ssl=pin, headers=bad) as refused:
                    assert refused.status == 403
                    assert f"is not this page's origin {origin}:" in await refused.text()
                with pytest.raises(aiohttp.ClientError):
                    await http.get(f"http://127.0.0.1:{port}/?token={token}")
                wss = f"wss://127.0.0.1:{port}/ws?token={token}"
                async with http.ws_connect(wss, ssl=pin, headers={"Origin": origin}) as ws:
                    sock = ws.get_extra_info("socket")
                    session = await texts_until(ws, "session")
                    assert "video" in session["streams"]
                async with asyncio.timeout(10):  # its TLS shutdown ends before the loop does
                    while sock.fileno() != -1:
                        await asyncio.sleep(0.01)

        asyncio.run(check())
        served = ssl.get_server_certificate(("127.0.0.1", port))  # what any client is shown
        assert hashlib.sha256(ssl.PEM_cert_to_DER_cert(served)).hexdigest() == pin.fingerprint.hex()
        # the page left: the run ends by itself, grace_s later
        assert process.wait(60) == 0, process.stderr.read()
    assert not Path(cert).parent.exists()


def test_the_self_signed_certificate_names_the_host_and_keeps_no_key() -> None:
    """SelfSigned: the host, localhost and 127.0.0.1 in subjectAltName, a private folder with
    the certificate alone (the key removed once loaded), all gone at close."""
    from cryptography import x509

    with SelfSigned("192.0.2.7") as made:
        assert made.folder.stat().st_mode & 0o777 == 0o700
        assert sorted(os.listdir(made.folder)) == ["cert.pem"]
        certificate = x509.load_pem_x509_certificate(made.cert.read_bytes())
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert "localhost" in names.get_values_for_type(x509.DNSName)
        addresses = {str(a) for a in names.get_values_for_type(x509.IPAddress)}
        assert {"192.0.2.7", "127.0.0.1", "::1"} <= addresses
        assert made.context.minimum_version == ssl.TLSVersion.TLSv1_2
        assert fingerprints(made.cert) == (made.sha256, made.spki)
    assert not made.folder.exists()


def test_web_transport_over_tls_says_https_and_checks_the_https_origin() -> None:
    """WebTransport(tls=…): url and ws_url are https/wss, and the page's origin is https."""
    with SelfSigned("127.0.0.1") as made:
        web = WebTransport(port=0, tls=made.context, token="T" * 20)
        assert web.url == f"https://127.0.0.1:0/?token={'T' * 20}"
        assert web.ws_url.startswith("wss://127.0.0.1:0/ws?token=")
        assert web.secure_context
        assert (
            web.server.gate.refuse(host="h:1", origin=None, token=None, scheme="https") is not None
        )
    assert not WebTransport(host="0.0.0.0", allow_remote=True).secure_context
    with pytest.raises(ValueError, match=r"^tls must be an ssl.SSLContext, got 'x'$"):
        WebTransport(tls="x")  # type: ignore[arg-type]


def test_what_a_tls_proxy_or_an_ssh_tunnel_forwards_passes_the_checks() -> None:
    """The headers session.md has a TLS proxy send to a loopback rxstream pass, another
    site's Origin through it is refused; so is a tunnel's other local port."""
    gate = WebTransport(port=8765, token="T" * 20).server.gate
    token = "T" * 20
    proxied = {"host": "127.0.0.1:8765", "token": token}
    assert gate.refuse(origin="http://127.0.0.1:8765", **proxied) is None
    assert gate.refuse(origin="https://evil.example", **proxied) is not None
    assert gate.refuse(origin="https://stream.example.com", **proxied) is not None  # not rewritten
    tunnel = {"host": "127.0.0.1:9000", "token": token}
    assert gate.refuse(origin="http://127.0.0.1:9000", **tunnel) is None


# --- bad flags: one line, exit 2, before anything runs ----------------------------------------


def test_tls_flags_go_with_serve_and_together(
    capsys: pytest.CaptureFixture[str], pair: tuple[Path, Path]
) -> None:
    """Without --serve, one of the pair alone, or self-signed with a pair: a usage error."""
    cert, key = map(str, pair)
    cases = [
        (["--tls-self-signed"], "--tls-cert, --tls-key and --tls-self-signed go with --serve"),
        (
            ["--tls-cert", cert, "--tls-key", key],
            "--tls-cert, --tls-key and --tls-self-signed go with --serve",
        ),
        (
            ["--serve", "--tls-cert", cert],
            "--tls-cert and --tls-key go together: --tls-cert "
            "was given without --tls-key (the certificate and its private key)",
        ),
        (
            ["--serve", "--tls-key", key],
            "--tls-cert and --tls-key go together: --tls-key "
            "was given without --tls-cert (the certificate and its private key)",
        ),
        (
            ["--serve", "--tls-self-signed", "--tls-cert", cert, "--tls-key", key],
            "--tls-self-signed makes its own certificate: give it or --tls-cert/--tls-key, not "
            "both",
        ),
    ]
    for argv, line in cases:
        assert _err(capsys, argv) == (2, f"rxstream run: {line}\n"), argv


def _bad_files(tmp: Path, cert: Path, key: Path) -> list[tuple[list[str], str]]:
    """(cert, key) arguments and the line that refuses them."""
    garbage = tmp / "garbage.pem"
    garbage.write_text("not a pem\n")
    other_cert, other_key = tmp / "other.pem", tmp / "other-key.pem"
    _make("127.0.0.1", other_cert, other_key)
    from cryptography.hazmat.primitives import serialization

    locked = tmp / "locked.pem"
    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    locked.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    missing = tmp / "missing.pem"
    beneath = garbage / "cert.pem"  # under a file: cannot be read
    return [
        ([str(missing), str(key)], f"--tls-cert {missing}: no such file"),
        ([str(beneath), str(key)], f"--tls-cert {beneath}: cannot read it: Not a directory"),
        ([str(cert), str(missing)], f"--tls-key {missing}: no such file"),
        ([str(tmp), str(key)], f"--tls-cert {tmp} is a folder; give a PEM file"),
        (
            [str(garbage), str(key)],
            f"--tls-cert {garbage}: not a PEM certificate (-----BEGIN CERTIFICATE-----)",
        ),
        (
            [str(cert), str(garbage)],
            f"--tls-key {garbage}: not a PEM private key (-----BEGIN PRIVATE KEY-----)",
        ),
        (
            [str(cert), str(other_key)],
            f"--tls-key {other_key} is not the key of --tls-cert {cert}: give the private key "
            "the certificate was made for",
        ),
        (
            [str(cert), str(locked)],
            f"--tls-key {locked}: the key is encrypted: give it unencrypted (openssl pkey -in "
            "KEY -out KEY.pem), readable by this user only",
        ),
    ]


def test_bad_certificate_files_are_one_line_before_the_app_loads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, pair: tuple[Path, Path]
) -> None:
    """A missing, unparsable, mismatched or encrypted cert/key: one line naming the flag and
    the file, exit 2, checked before the app is loaded (an app that is not there is not said)."""
    for (cert, key), line in _bad_files(tmp_path, *pair):
        argv = ["run", str(tmp_path / "no_app.py"), "--serve", "--tls-cert", cert]
        assert cli.main([*argv, "--tls-key", key]) == 2, line
        assert capsys.readouterr().err == f"rxstream run: {line}\n"


def test_server_context_names_its_arguments_by_default(pair: tuple[Path, Path]) -> None:
    """server_context() outside the command line names tls_cert/tls_key."""
    cert, _ = pair
    with pytest.raises(ValueError, match=rf"^tls_key {re.escape(str(cert))}: not a PEM private"):
        server_context(cert, cert)


# --- plain http on a host that is not loopback ---------------------------------------------------


@pytest.mark.slow
def test_plain_http_on_a_remote_host_warns_once_at_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--host 0.0.0.0 --allow-remote without TLS: one warning line at start (no log line beside
    it); with --tls-self-signed, or on loopback, none."""
    argv = ["--serve", "--port", "0", "--timeout", "0.3", "--set", "fps=20"]
    status, err = _err(capsys, [*argv, "--host", "0.0.0.0", "--allow-remote"])
    assert status == 0
    warning = (
        "rxstream run: warning: serving http:// on 0.0.0.0, not loopback, without TLS: a remote "
        "visitor's page is not a secure context (no WebCodecs: JPEG at several times the bytes; "
        "no pointer raw updates); give --tls-cert/--tls-key or --tls-self-signed, or put a TLS "
        'proxy or an SSH tunnel in front (docs/session.md, "Serving to remote visitors")'
    )
    assert err.splitlines().count(warning) == 1
    assert "web_not_secure" not in err
    for more in (["--host", "0.0.0.0", "--allow-remote", "--tls-self-signed"], []):
        status, err = _err(capsys, [*argv, *more])
        assert status == 0
        assert "secure context" not in err, more


# --- a real browser -------------------------------------------------------------------------


def _served(web: WebTransport) -> Served:
    """Paced h264 frames behind ``web``, in a thread while in ``with``."""
    ctx = rxstream.Context(transport=web)

    def frames() -> Iterator[np.ndarray]:
        for index in itertools.count():
            yield np.full((64, 64, 3), index * 7 % 256, dtype=np.uint8)

    return Served(web, ctx.source(frames) | ctx.pace(fps=30) | ctx.stream("video", codec="h264"))


@pytest.mark.browser
@pytest.mark.slow
def test_in_chromium_https_is_a_secure_context_and_plain_http_says_why_it_is_on_jpeg() -> None:
    """Chromium given the SPKI pin: the https page is a secure context on the WebCodecs path;
    the http page under a name that is not loopback (mapped to 127.0.0.1) is not, and its
    label says why it is on JPEG."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with (
        SelfSigned("127.0.0.1") as made,
        _served(WebTransport(port=0, grace_s=0.3, tls=made.context)) as secure,
        _served(WebTransport(port=0, grace_s=0.3, allowed_hosts=("rxstream.test",))) as plain,
        sync_api.sync_playwright() as playwright,
    ):
        args = [
            *photon_bench().CHROMIUM_ARGS,
            f"--ignore-certificate-errors-spki-list={made.spki}",
            "--host-resolver-rules=MAP rxstream.test 127.0.0.1",
        ]
        browser = playwright.chromium.launch(executable_path=chromium, args=args)
        try:
            page = browser.new_page()
            page.goto(secure.web.url)
            page.wait_for_function("window.rxstream.frames > 10", timeout=20_000)
            assert page.evaluate("window.isSecureContext") is True
            assert page.evaluate("window.rxstream.video") == "webcodecs"
            assert page.locator("#video-path").text_content() == "video: WebCodecs h264"
            assert page.evaluate("window.rxstream.errors") == []

            page = browser.new_page()
            port = plain.web.bound_port
            page.goto(f"http://rxstream.test:{port}/?token={plain.web.token}")
            page.wait_for_function("window.rxstream.frames > 10", timeout=20_000)
            assert page.evaluate("window.isSecureContext") is False
            assert page.evaluate("window.rxstream.lastHeader.codec") == "jpeg"
            label = page.locator("#video-path").text_content()
            assert label == "video: JPEG (not a secure context: serve over HTTPS)"
        finally:
            browser.close()
