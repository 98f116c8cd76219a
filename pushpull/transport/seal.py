"""Encryption of a lane's messages between machines: AES-128-GCM keyed by an ephemeral X25519 exchange and the job
secret, from the ``cryptography`` package (OpenSSL underneath, AES-NI/VAES where the CPU has them).

Why not CURVE on the data path: libzmq's CURVE (XSalsa20-Poly1305) copies every message into a padded buffer to
encrypt it and again to decrypt it, and costs 3.4x PLAIN on loopback; a lane sealed with AES-GCM encrypts each
frame once into the buffer the socket sends, and decrypts it in place in the buffer the socket filled.

The construction is TLS 1.3's ``psk_dhe_ke`` mode in small, not a new one:

* handshake (pushpull.transport.lane): the server's greeting carries its nonce and an ephemeral X25519 public key,
  the client answers with its identity, its nonce and public key, and an HMAC-SHA256 under the job's lane key over
  all of them; the server answers with an HMAC under another label. Both ends thus prove they hold the job secret,
  and the transcript they sign includes both ephemeral keys, so no one in the middle can swap them;
* keys: HKDF-SHA256 (RFC 5869) over the X25519 shared secret and the lane key, salted with both nonces, gives one
  AES-128 key per direction. Fresh ephemeral keys per connection give forward secrecy: a recorded connection stays
  unreadable even to whoever later learns the job secret;
* records: every frame of a message is one AEAD record, its nonce the direction's record counter (so a replayed,
  dropped or reordered record fails), its associated data the message's length, the frame's index and the frame's
  sealed length (so frames cannot be moved between messages, cut off or re-split).

A record that fails to open closes the connection: nothing of it reaches a handler.
"""
from __future__ import annotations

import struct

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

TAG = 16  # bytes GCM adds to each record
PUBLIC_BYTES = 32  # an X25519 public key
_AAD = struct.Struct("<III")  # message length, frame index, sealed frame length
_NONCE_PAD = bytes(4)


class SealError(ConnectionError):
    """A record failed authentication (tampered with, replayed, or another key): the connection is closed."""


class Ephemeral:
    """One side's X25519 key pair for one connection."""

    def __init__(self) -> None:
        self._key = X25519PrivateKey.generate()
        self.public = self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

    def shared(self, peer_public: bytes) -> bytes:
        if len(peer_public) != PUBLIC_BYTES:
            raise SealError("the peer's key exchange value has the wrong length")
        try:
            return self._key.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
        except ValueError as e:  # a low-order point: an all-zero shared secret
            raise SealError(f"the peer's key exchange value is unusable: {e}") from None


def _aead(key: bytes):
    return AESGCM(key)


class Session:
    """The two directions of one sealed connection: :meth:`seal` what this end sends, :meth:`open` what it reads."""

    def __init__(self, shared: bytes, lane_key: bytes, snonce: bytes, cnonce: bytes, identity: bytes,
                 client: bool):
        keys = HKDF(algorithm=hashes.SHA256(), length=32, salt=snonce + cnonce,
                    info=b"pushpull lane seal v1\0" + identity).derive(shared + lane_key)
        c2s, s2c = keys[:16], keys[16:]
        self._out = _aead(c2s if client else s2c)
        self._in = _aead(s2c if client else c2s)
        self._sent = 0  # records sealed (the next one's nonce)
        self._read = 0  # records opened

    @staticmethod
    def sealed_size(sizes) -> int:
        """The length field of a message whose frames have ``sizes`` bytes each, once sealed."""
        return sum(4 + n + TAG for n in sizes)

    def seal(self, parts) -> tuple[list, int]:
        """The buffers (for ``sendmsg``) and byte count of the lane message carrying ``parts``, each frame sealed."""
        views = [memoryview(p).cast("B") for p in parts]
        total = self.sealed_size(v.nbytes for v in views)
        out: list = [struct.pack("<I", total)]
        for i, v in enumerate(views):
            n = v.nbytes + TAG
            head = struct.pack("<I", n)
            ct = np.empty(n, np.uint8)  # not zeroed first: the cipher writes every byte
            self._out.encrypt_into(self._nonce(self._sent), v, _AAD.pack(total, i, n), ct)
            self._sent += 1
            out.append(head)
            out.append(ct)
        return out, total + 4

    def open(self, total: int, frames: list) -> list:
        """The plaintext of a sealed message's ``frames`` (writable views of the buffers they were read into,
        decrypted in place). Raises SealError when any record fails."""
        out = []
        for i, f in enumerate(frames):
            n = f.nbytes
            if n < TAG:
                raise SealError("a sealed frame shorter than its tag")
            plain = f[:n - TAG]
            try:
                self._in.decrypt_into(self._nonce(self._read), f, _AAD.pack(total, i, n), plain)
            except InvalidTag:
                raise SealError("a record failed authentication (tampered with, replayed or out of order)") from None
            self._read += 1
            out.append(plain)
        return out

    @staticmethod
    def _nonce(counter: int) -> bytes:
        return _NONCE_PAD + counter.to_bytes(8, "little")
