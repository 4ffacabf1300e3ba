"""A real SMTP server on loopback for countersign's email tests.

    smtp_sink.py PORT OUTDIR [--tls starttls|implicit --ca-out PEM] [--auth USER:PASSWORD]

Listens on 127.0.0.1:PORT (aiosmtpd), parses each message with the standard library's
email package (independently of countersign's MIME writer) and writes it as one JSON
file to OUTDIR: envelope, headers, the text and HTML bodies, and whether the session was
under TLS and who authenticated. Prints READY once it accepts connections; runs until
killed.

With --tls it makes a throwaway certificate authority and a server certificate for
127.0.0.1 and localhost (Python's `cryptography`), writes the authority's certificate to
--ca-out, and speaks TLS: after STARTTLS, which it then requires before anything else, or
from the first byte. With --auth it requires AUTH (PLAIN or LOGIN) with these
credentials, which aiosmtpd only accepts over TLS.
"""

import argparse
import datetime
import email
import ipaddress
import json
import os
import ssl
import tempfile
import threading
import time
import uuid
from email import policy

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword


class Sink:
    def __init__(self, out):
        self.out = out

    async def handle_DATA(self, server, session, envelope):
        msg = email.message_from_bytes(envelope.content, policy=policy.default)
        text = msg.get_body(preferencelist=("plain",))
        html = msg.get_body(preferencelist=("html",))
        record = {
            "mail_from": envelope.mail_from,
            "rcpt_tos": envelope.rcpt_tos,
            "from": str(msg["From"]),
            "to": str(msg["To"]),
            "subject": str(msg["Subject"]),
            "message_id": str(msg["Message-ID"]),
            "auto_submitted": str(msg.get("Auto-Submitted", "")),
            "content_type": msg.get_content_type(),
            "text": text.get_content() if text is not None else None,
            "html": html.get_content() if html is not None else None,
            # STARTTLS sets session.ssl; TLS from the first byte shows on the transport.
            "tls": session.ssl is not None
            or server.transport.get_extra_info("ssl_object") is not None,
            "login": login_of(session),
        }
        name = f"{time.time_ns()}-{uuid.uuid4().hex}.json"
        tmp = os.path.join(self.out, name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.rename(tmp, os.path.join(self.out, name))
        return "250 OK"


def login_of(session):
    """The user name the session authenticated as, if it did."""
    if not session.authenticated or not isinstance(session.auth_data, LoginPassword):
        return None
    return session.auth_data.login.decode()


class Authenticator:
    def __init__(self, user, password):
        self.user, self.password = user.encode(), password.encode()

    def __call__(self, server, session, envelope, mechanism, auth_data):
        ok = (
            isinstance(auth_data, LoginPassword)
            and auth_data.login == self.user
            and auth_data.password == self.password
        )
        return AuthResult(success=ok, handled=False, auth_data=auth_data)


def make_certificates(ca_out):
    """A CA and a server certificate signed by it; returns (cert_path, key_path)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "countersign test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    with open(ca_out, "wb") as f:
        f.write(ca.public_bytes(serialization.Encoding.PEM))
    workdir = tempfile.mkdtemp(prefix="smtp-sink-tls-")
    cert_path, key_path = os.path.join(workdir, "cert.pem"), os.path.join(workdir, "key.pem")
    with open(cert_path, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return cert_path, key_path


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("out")
    parser.add_argument("--tls", choices=["starttls", "implicit"])
    parser.add_argument("--ca-out")
    parser.add_argument("--auth")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    options = {}
    if args.tls:
        cert, key = make_certificates(args.ca_out)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        if args.tls == "starttls":
            options.update(tls_context=context, require_starttls=True)
        else:
            options.update(ssl_context=context)
    if args.auth:
        user, password = args.auth.split(":", 1)
        options.update(authenticator=Authenticator(user, password), auth_required=True)
        if args.tls == "implicit":
            # aiosmtpd only counts STARTTLS as TLS when deciding to offer AUTH; here the
            # whole connection is TLS (each message records that it was).
            options.update(auth_require_tls=False)
    controller = Controller(Sink(args.out), hostname="127.0.0.1", port=args.port, **options)
    controller.start()
    print("READY", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
