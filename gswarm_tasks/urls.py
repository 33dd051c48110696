"""Every outbound URL, parsed once: `parse_url` owns the reading of scheme, host, port and path, `Allow` decides
from that parse, and `fetch` connects to the address that was checked (resolved once, never again) and sends that
same path, following no redirect. Whatever another parser might read differently is refused: backslashes, user
information, control characters and spaces, percent-encoded or non-IDNA hosts, and numeric hosts that are not a
canonical IPv4 address."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import certifi
import idna
import urllib3

from .errors import InvalidRequest, NetworkError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_URL = 2048
DEFAULT_PORTS = {"http": 80, "https": 443}
_URL_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)([^#]*)(?:#.*)?", re.S)
_AUTHORITY_RE = re.compile(r"(?:\[([0-9A-Fa-f:.]+)\]|([^:\[\]]*))(?::([0-9]{1,5}))?")
_LABEL_RE = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
_NUMERIC_LABEL_RE = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
_TARGET_RE = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*")
_BAD_PERCENT_RE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_REFUSED_CHARS_RE = re.compile(r"[\x00-\x20\x7f\\]")
_SERVICE_REF_RE = re.compile(r"\$\{\s*([A-Za-z0-9][A-Za-z0-9_-]*)\.(?:output\.)?service_url\s*\}(.*)", re.S)


@dataclass(frozen=True)
class Url:
    """A parsed URL: what is checked is what is fetched."""

    scheme: str
    host: str  # lower-case ASCII (IDNA for international names); an IPv6 address has no brackets
    port: int
    target: str  # the path and query, as sent on the request line
    explicit_port: bool = False

    @property
    def ip(self) -> IPAddress | None:
        """The host as an address when it is one (a literal IPv4 or IPv6 address)."""
        try:
            return ipaddress.ip_address(self.host)
        except ValueError:
            return None

    @property
    def host_text(self) -> str:
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def authority(self) -> str:
        """What the Host header carries: the host, and the port when the URL named one."""
        return self.host_text + (f":{self.port}" if self.explicit_port else "")

    @property
    def origin(self) -> str:
        """`scheme://host:port`, with the port always written: two URLs of one server have the same origin."""
        return f"{self.scheme}://{self.host_text}:{self.port}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.authority}{self.target}"

    def join(self, path: str, field_name: str = "url") -> Url:
        """This URL's origin with `path` appended to its path (an endpoint of a service)."""
        base = self.target.split("?", 1)[0].rstrip("/")
        return parse_url(f"{self.scheme}://{self.authority}{base}/{path.lstrip('/')}", field_name)


def _refuse(field_name: str, value: str, why: str) -> InvalidRequest:
    return InvalidRequest(f"{field_name}: {value[:200]!r} {why}", {"field": field_name, "value": value[:500]})


def _host(raw: str, field_name: str, value: str) -> str:
    """The host in the one form every later step compares: lower-case ASCII, IDNA for non-ASCII names."""
    if not raw:
        raise _refuse(field_name, value, "has no host")
    if "%" in raw:
        raise _refuse(field_name, value, "has a percent-encoded host")
    if not raw.isascii():
        try:
            raw = idna.encode(raw, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError) as exc:
            raise _refuse(
                field_name, value, "has a host that is not a valid internationalized domain name"
            ) from exc
    host = raw.lower()
    labels = host.split(".")
    if len(host) > 253 or not all(_LABEL_RE.fullmatch(label) for label in labels):
        raise _refuse(field_name, value, "has a host that is not a domain name or an IPv4 address")
    if _NUMERIC_LABEL_RE.fullmatch(labels[-1]):  # resolvers read 127.1, 0x7f.1 or 2130706433 as addresses
        try:
            return str(ipaddress.IPv4Address(host))
        except ValueError as exc:
            raise _refuse(
                field_name, value, "has a numeric host that is not a canonical IPv4 address"
            ) from exc
    if any(label.startswith("xn--") for label in labels):
        try:
            idna.decode(host)
        except (idna.IDNAError, UnicodeError) as exc:
            raise _refuse(
                field_name, value, "has a host that is not a valid internationalized domain name"
            ) from exc
    return host


def _remove_dot_segments(path: str) -> str:
    """RFC 3986 5.2.4: what an HTTP client would send for `/a/../b` is `/b`, so that is what is checked."""
    out: list[str] = []
    segments = path.split("/")
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg == ".":
            if last:
                out.append("")
        elif seg == "..":
            if len(out) > 1:
                out.pop()
            if last:
                out.append("")
        else:
            out.append(seg)
    joined = "/".join(out)
    return joined if joined.startswith("/") else "/" + joined


def _target(rest: str, field_name: str, value: str) -> str:
    if not rest.isascii() or not _TARGET_RE.fullmatch(rest) or _BAD_PERCENT_RE.search(rest):
        raise _refuse(field_name, value, "has characters in its path that must be percent-encoded")
    path, sep, query = rest.partition("?")
    return _remove_dot_segments(path or "/") + sep + query


def parse_url(value: Any, field_name: str = "url", schemes: Iterable[str] = ("http", "https")) -> Url:
    """Parse an outbound URL, refusing anything two parsers could read differently."""
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{field_name}: a URL is required", {"field": field_name})
    if len(value) > MAX_URL:
        raise _refuse(field_name, value, f"is longer than {MAX_URL} characters")
    if _REFUSED_CHARS_RE.search(value):
        raise _refuse(field_name, value, "has a backslash, a space or a control character")
    m = _URL_RE.fullmatch(value)
    allowed = tuple(schemes)
    if m is None or m.group(1).lower() not in allowed:
        raise _refuse(
            field_name, value, f"is not a URL with scheme {' or '.join(s + '://' for s in allowed)}"
        )
    scheme, authority, rest = m.group(1).lower(), m.group(2), m.group(3)
    if "@" in authority:
        raise _refuse(field_name, value, "has user information (user@host), which is not allowed")
    am = _AUTHORITY_RE.fullmatch(authority)
    if am is None or (authority.endswith(":") and am.group(3) is None):
        raise _refuse(field_name, value, "has a malformed host or port")
    if am.group(1) is not None:
        try:
            host = str(ipaddress.IPv6Address(am.group(1)))
        except ValueError as exc:
            raise _refuse(field_name, value, "has a malformed IPv6 address") from exc
    else:
        host = _host(am.group(2), field_name, value)
    port = int(am.group(3)) if am.group(3) is not None else DEFAULT_PORTS.get(scheme, 0)
    if not 0 < port < 65536:
        raise _refuse(field_name, value, "has a port outside 1-65535")
    url = Url(scheme, host, port, _target(rest, field_name, value), am.group(3) is not None)
    _same_for_others(url, field_name, value)
    return url


def _same_for_others(url: Url, field_name: str, value: str) -> None:
    """urllib and urllib3 (what requests uses) must read the canonical form exactly as parsed."""
    from urllib3.util import parse_url as urllib3_parse

    text = str(url)
    try:
        theirs = urllib3_parse(text)
        split = urlsplit(text)
        same = (
            (theirs.scheme, (theirs.host or "").strip("[]").lower(), theirs.port or url.port)
            == (split.scheme, (split.hostname or ""), split.port or url.port)
            == (url.scheme, url.host, url.port)
        )
    except ValueError:
        same = False
    if not same:
        raise _refuse(field_name, value, "is read differently by other URL parsers")


def service_ref(value: Any) -> tuple[str, str] | None:
    """A workflow URL that starts with `${step.service_url}`: (the step, what follows: a path or nothing)."""
    m = _SERVICE_REF_RE.fullmatch(value) if isinstance(value, str) else None
    return (m.group(1), m.group(2)) if m else None


def is_public(addr: IPAddress) -> bool:
    """Not private, loopback, link-local, multicast, reserved or unspecified (IPv4-mapped addresses included)."""
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_global and not addr.is_multicast and not addr.is_reserved


@dataclass(frozen=True)
class Allow:
    """An allowlist: host names (`host`, `host:port`), addresses and networks (`10.0.0.5`, `10.0.0.0/8`,
    `[fd00::1]:8000`), and exact origins (a replica's URL). Private addresses are reached only where an address
    or network entry names them, or through an exact origin."""

    setting: str
    names: frozenset[tuple[str, int | None]] = frozenset()
    networks: tuple[tuple[IPNetwork, int | None], ...] = ()
    origins: frozenset[str] = frozenset()
    entries: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def of(cls, entries: Iterable[str], setting: str, origins: Iterable[str] = ()) -> Allow:
        names: set[tuple[str, int | None]] = set()
        nets: list[tuple[IPNetwork, int | None]] = []
        kept = []
        for raw in entries:
            entry = str(raw).strip().lower()
            if not entry:
                continue
            kept.append(entry)
            host, port = _split_entry(entry, setting)
            try:
                nets.append((ipaddress.ip_network(host, strict=False), port))
            except ValueError:
                names.add((_host(host, setting, entry), port))
        return cls(setting, frozenset(names), tuple(nets), frozenset(origins), tuple(kept))

    def _net_port(self, addr: IPAddress, port: int) -> bool:
        return any(addr in net and p in (None, port) for net, p in self.networks)

    def permits(self, url: Url) -> bool:
        """The URL's host (and port) is listed, or its origin is."""
        if url.origin in self.origins:
            return True
        ip = url.ip
        if ip is not None:
            return self._net_port(ip, url.port)
        return (url.host, None) in self.names or (url.host, url.port) in self.names

    def permits_address(self, url: Url, addr: IPAddress) -> bool:
        """May the connection for `url` go to `addr`: a public address, or one this list names."""
        return is_public(addr) or url.origin in self.origins or self._net_port(addr, url.port)

    def describe(self) -> str:
        return ", ".join(self.entries) or "none"

    def check(self, url: Url, field_name: str) -> Url:
        """Refuse, naming the field and the setting, a URL this list does not allow."""
        if not self.permits(url):
            raise InvalidRequest(
                f"{field_name}: host {url.authority!r} is not in {self.setting} ({self.describe()})",
                {"field": field_name, "value": str(url), "host": url.authority},
            )
        ip = url.ip
        if ip is not None and not self.permits_address(url, ip):
            raise _refuse(field_name, str(url), f"is a private address not named in {self.setting}")
        return url


def _split_entry(entry: str, setting: str) -> tuple[str, int | None]:
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else None
    elif entry.count(":") == 1:
        host, port = entry.split(":")
    else:
        host, port = entry, None
    if port is not None and (not port.isdigit() or not 0 < int(port) < 65536):
        raise InvalidRequest(f"{setting}: {entry!r} has a bad port", {"field": setting, "value": entry})
    return host, int(port) if port is not None else None


def resolve(url: Url, allow: Allow, field_name: str) -> str:
    """The one address the connection goes to: the literal address, or the host resolved once; every address the
    name has must be one the list permits (a name that also resolves somewhere private is refused)."""
    allow.check(url, field_name)
    if url.ip is not None:
        return url.host
    try:
        infos = socket.getaddrinfo(url.host, url.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise NetworkError(
            f"{field_name}: {url.host} does not resolve: {exc}"[:300], {"field": field_name}
        ) from exc
    addrs = list(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in infos))
    for a in addrs:
        if not allow.permits_address(url, ipaddress.ip_address(a)):
            raise _refuse(
                field_name, str(url), f"resolves to {a}, a private address not named in {allow.setting}"
            )
    if not addrs:
        raise NetworkError(f"{field_name}: {url.host} has no address", {"field": field_name})
    return addrs[0]


@contextmanager
def fetch(
    url: Url,
    allow: Allow,
    field_name: str,
    method: str = "GET",
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: tuple[float, float] = (10.0, 60.0),
) -> Iterator[urllib3.BaseHTTPResponse]:
    """One request for `url`: to the address `resolve` checked (a pool pinned to it, with the URL's Host header and
    TLS name), its path as parsed, no retry and no redirect followed (a 3xx is refused). The body is streamed."""
    addr = resolve(url, allow, field_name)
    limits = urllib3.Timeout(connect=timeout[0], read=timeout[1])
    pool: urllib3.HTTPConnectionPool
    if url.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            addr,
            url.port,
            timeout=limits,
            maxsize=1,
            retries=False,
            cert_reqs="CERT_REQUIRED",
            ca_certs=certifi.where(),
            server_hostname=url.host,
            assert_hostname=url.host,
        )
    else:
        pool = urllib3.HTTPConnectionPool(addr, url.port, timeout=limits, maxsize=1, retries=False)
    sent = {"Host": url.authority, "User-Agent": "gswarm", **(headers or {})}
    try:
        try:
            r = pool.urlopen(
                method,
                url.target,
                body=body,
                headers=sent,
                redirect=False,
                retries=False,
                preload_content=False,
                assert_same_host=False,
            )
        except urllib3.exceptions.HTTPError as exc:
            raise NetworkError(
                f"{field_name}: {method} {url} failed: {type(exc).__name__}: {exc}"[:500],
                {"field": field_name},
            ) from exc
        try:
            if 300 <= r.status < 400:
                where = str(r.headers.get("Location", ""))[:200]
                raise InvalidRequest(
                    f"{field_name}: {url} answered {r.status}, a redirect to {where!r}: redirects are not followed",
                    {"field": field_name, "status": r.status, "location": where},
                )
            yield r
        finally:
            r.close()
    finally:
        pool.close()


def read_bounded(r: urllib3.BaseHTTPResponse, limit: int, field_name: str) -> bytes:
    """A response's whole body, refused past `limit` bytes (a peer cannot make the node hold more)."""
    parts: list[bytes] = []
    got = 0
    try:
        for block in r.stream(1 << 16):
            got += len(block)
            if got > limit:
                raise InvalidRequest(f"{field_name}: the answer is over {limit} bytes", {"field": field_name})
            parts.append(block)
    except urllib3.exceptions.HTTPError as exc:
        raise NetworkError(
            f"{field_name}: reading the answer failed: {type(exc).__name__}", {"field": field_name}
        ) from exc
    return b"".join(parts)
