"""A real SMTP server on loopback for countersign's email tests.

    smtp_sink.py PORT OUTDIR

Listens on 127.0.0.1:PORT (aiosmtpd), parses each message with the standard library's
email package (independently of countersign's MIME writer) and writes it as one JSON
file to OUTDIR: envelope, headers, the text and HTML bodies. Prints READY once it
accepts connections; runs until killed.
"""

import email
import json
import os
import sys
import threading
import time
import uuid
from email import policy

from aiosmtpd.controller import Controller


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
        }
        name = f"{time.time_ns()}-{uuid.uuid4().hex}.json"
        tmp = os.path.join(self.out, name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(record, f)
        os.rename(tmp, os.path.join(self.out, name))
        return "250 OK"


def main():
    port, out = int(sys.argv[1]), sys.argv[2]
    os.makedirs(out, exist_ok=True)
    controller = Controller(Sink(out), hostname="127.0.0.1", port=port)
    controller.start()
    print("READY", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
