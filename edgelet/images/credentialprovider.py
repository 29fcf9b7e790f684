"""Registry credentials from credential provider plugins, as the kubelet runs them (its
--image-credential-provider-config and --image-credential-provider-bin-dir). Imported only when configured.

A `CredentialProviderConfig` (kubelet.config.k8s.io/v1, YAML or JSON) lists providers: an executable `name` in
the bin dir, the `matchImages` it serves (globs in host labels, a port and path prefix), `defaultCacheDuration`,
the `apiVersion` it speaks (credentialprovider.kubelet.k8s.io/v1), its `args` and `env`. For an image a provider
matches, the agent writes a `CredentialProviderRequest` to the plugin's stdin and reads a
`CredentialProviderResponse` from its stdout: `auth` (registry key -> username/password), `cacheKeyType` (Image,
Registry or Global: what the answer is good for) and `cacheDuration` (else the provider's default; 0 keeps
nothing). The answer is kept that long, so the plugin runs once per image, registry or node per period, and
concurrent pulls wait for one run.

Credentials stay in memory: no log line, error or repr carries a username's password, a plugin's stdout or its
env values.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from edgelet.config import format_duration, parse_duration
from edgelet.images import auth, reference
from edgelet.util.errors import ConfigError, EdgeletError, YAMLError

log = logging.getLogger(__name__)

CONFIG_API_VERSION = "kubelet.config.k8s.io/v1"
CONFIG_KIND = "CredentialProviderConfig"
PLUGIN_API_VERSION = "credentialprovider.kubelet.k8s.io/v1"
REQUEST_KIND = "CredentialProviderRequest"
RESPONSE_KIND = "CredentialProviderResponse"
CACHE_KEY_TYPES = ("Image", "Registry", "Global")
GLOBAL_CACHE_KEY = "global"
# How long a plugin may run; its answer is what a pull waits for.
PLUGIN_TIMEOUT = 60.0
# The most a plugin may print: an answer is a few kilobytes.
MAX_RESPONSE_BYTES = 1024 * 1024


class ProviderConfigError(ConfigError):
    """A CredentialProviderConfig that cannot be used; it names the file and the field."""


class ProviderError(EdgeletError):
    """A plugin that could not give credentials (it failed, timed out or answered nonsense)."""


# -- matching, as the kubelet's URLsMatch ------------------------------------------------------------

def _schemeless(text: str) -> tuple[str, str, str]:
    """(host, port, path) of a scheme-less URL like "host:port/path"."""
    hostport, slash, path = text.partition("/")
    if hostport.startswith("["):
        host, _, rest = hostport.partition("]")
        return host + "]", rest.removeprefix(":"), slash + path
    host, _, port = hostport.partition(":")
    return host, port, slash + path


def url_matches(glob: str, target: str) -> bool:
    """Whether image `target` matches `glob`: equal ports, as many host labels each matching its glob, and the
    glob's path a prefix of the target's (kubelet's URLsMatch: no globs in port or path)."""
    glob_host, glob_port, glob_path = _schemeless(glob)
    host, port, path = _schemeless(target)
    if glob_port != port:
        return False
    glob_labels, labels = glob_host.split("."), host.split(".")
    if len(glob_labels) != len(labels) or not path.startswith(glob_path):
        return False
    return all(fnmatch.fnmatchcase(label, pattern) for pattern, label in zip(glob_labels, labels))


def match_image_error(pattern: str) -> str | None:
    """Why `pattern` is not a matchImages entry (kubelet's validation), or None."""
    if not pattern:
        return "must not be empty"
    if "://" in pattern:
        return f"{pattern!r} must not have a scheme"
    host, port, path = _schemeless(pattern)
    if not host:
        return f"{pattern!r} has no host"
    if "*" in port or "?" in port or (port and not port.isdigit()):
        return f"{pattern!r}: the port must be a number (globs only in host labels)"
    if any(c in path for c in "*?["):
        return f"{pattern!r}: globs are allowed only in host labels, not in the path"
    return None


# -- the config --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Provider:
    name: str
    executable: str
    match_images: tuple[str, ...]
    default_cache_duration: float
    api_version: str = PLUGIN_API_VERSION
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)  # may hold secrets: not in any repr

    def matches(self, image: str) -> bool:
        return any(url_matches(pattern, image) for pattern in self.match_images)


def _expect(value: Any, kind: type, where: str, what: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise ValueError(f"{where}: expected {what}")
    return value


def _provider(item: Any, where: str, bin_dir: str) -> Provider:
    _expect(item, dict, where, "an object")
    known = {"name", "matchImages", "defaultCacheDuration", "apiVersion", "args", "env", "tokenAttributes"}
    if unknown := sorted(set(item) - known):
        raise ValueError(f"{where}: unknown field {unknown[0]!r}")
    if "tokenAttributes" in item:
        raise ValueError(f"{where}.tokenAttributes: service account tokens for providers are not supported")
    name = _expect(item.get("name"), str, f"{where}.name", "a string")
    if not name or name in (".", "..") or any(c in name for c in "/ "):
        raise ValueError(f"{where}.name: {name!r} must be a file name in the plugin directory")
    patterns = _expect(item.get("matchImages"), list, f"{where}.matchImages", "a list of image patterns")
    if not patterns:
        raise ValueError(f"{where}.matchImages: must not be empty")
    for index, pattern in enumerate(patterns):
        _expect(pattern, str, f"{where}.matchImages[{index}]", "a string")
        if problem := match_image_error(pattern):
            raise ValueError(f"{where}.matchImages[{index}]: {problem}")
    duration_text = _expect(item.get("defaultCacheDuration"), str, f"{where}.defaultCacheDuration",
                            'a duration like "12h"')
    try:
        duration = parse_duration(duration_text)
    except ValueError as err:
        raise ValueError(f"{where}.defaultCacheDuration: {err}") from None
    if duration < 0:
        raise ValueError(f"{where}.defaultCacheDuration: must not be negative")
    api_version = _expect(item.get("apiVersion"), str, f"{where}.apiVersion", "a string")
    if api_version != PLUGIN_API_VERSION:
        raise ValueError(f"{where}.apiVersion: {api_version!r} is not supported (only {PLUGIN_API_VERSION})")
    args = _expect(item.get("args", []), list, f"{where}.args", "a list of strings")
    for index, arg in enumerate(args):
        _expect(arg, str, f"{where}.args[{index}]", "a string")
    env: dict[str, str] = {}
    for index, var in enumerate(_expect(item.get("env", []), list, f"{where}.env", "a list of {name, value}")):
        _expect(var, dict, f"{where}.env[{index}]", "an object with name and value")
        var_name = _expect(var.get("name"), str, f"{where}.env[{index}].name", "a string")
        env[var_name] = _expect(var.get("value", ""), str, f"{where}.env[{index}].value", "a string")
    executable = os.path.join(bin_dir, name)
    if not os.access(executable, os.X_OK) or not os.path.isfile(executable):
        raise ValueError(f"{where}.name: no executable {executable}")
    return Provider(name, executable, tuple(patterns), duration, api_version, tuple(args), env)


def parse_provider_config(text: str, bin_dir: str) -> list[Provider]:
    """The providers of a CredentialProviderConfig document (YAML or JSON); ValueError names the field."""
    from edgelet import yamlload  # JSON is YAML; the loader is the agent's own

    try:
        document = yamlload.load(text)
    except YAMLError as err:
        raise ValueError(f"not YAML or JSON: {err}") from None
    _expect(document, dict, "the document", "an object")
    if document.get("kind") != CONFIG_KIND:
        raise ValueError(f"kind: expected {CONFIG_KIND}, got {document.get('kind')!r}")
    if document.get("apiVersion") != CONFIG_API_VERSION:
        raise ValueError(f"apiVersion: {document.get('apiVersion')!r} is not supported (only {CONFIG_API_VERSION})")
    items = _expect(document.get("providers"), list, "providers", "a list of providers")
    if not items:
        raise ValueError("providers: at least one provider is required")
    providers = [_provider(item, f"providers[{index}]", bin_dir) for index, item in enumerate(items)]
    names = [provider.name for provider in providers]
    for index, name in enumerate(names):
        if name in names[:index]:
            raise ValueError(f"providers[{index}].name: {name!r} is listed twice")
    return providers


def load_provider_config(path: str, bin_dir: str) -> list[Provider]:
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read(MAX_RESPONSE_BYTES + 1)
    except (OSError, UnicodeDecodeError) as err:
        raise ProviderConfigError(path, "", f"cannot read the credential provider config: {err}") from None
    try:
        return parse_provider_config(text, bin_dir)
    except ValueError as err:
        raise ProviderConfigError(path, "", str(err)) from None


# -- the plugin's answer ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Answer:
    cache_key_type: str
    cache_duration: float | None  # None: the provider's default
    auth: tuple[tuple[auth.RegistryKey, auth.AuthFields], ...] = field(repr=False)


def parse_response(data: bytes, api_version: str) -> Answer:
    """A CredentialProviderResponse; ValueError says what is wrong without quoting a credential."""
    try:
        response = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise ValueError("its output is not JSON") from None
    if not isinstance(response, dict):
        raise ValueError("its output is not a JSON object")
    if response.get("kind") != RESPONSE_KIND or response.get("apiVersion") != api_version:
        raise ValueError(f"expected kind {RESPONSE_KIND} of {api_version}, got {response.get('kind')!r} of "
                         f"{response.get('apiVersion')!r}")
    key_type = response.get("cacheKeyType")
    if key_type not in CACHE_KEY_TYPES:
        raise ValueError(f"cacheKeyType {key_type!r} is not one of {', '.join(CACHE_KEY_TYPES)}")
    duration = None
    if response.get("cacheDuration") not in (None, ""):
        try:
            duration = parse_duration(response["cacheDuration"])
        except ValueError as err:
            raise ValueError(f"cacheDuration: {err}") from None
    entries = response.get("auth")
    entries = {} if entries is None else entries
    if not isinstance(entries, dict):
        raise ValueError("auth: expected an object of registries")
    pairs = []
    for location, entry in entries.items():
        key = auth.parse_registry_key(location)
        if key is None or not isinstance(entry, dict):
            raise ValueError(f"auth: entry {location!r} is not a registry with username and password")
        fields = {name: entry[name] for name in ("username", "password") if isinstance(entry.get(name), str)}
        if fields:
            pairs.append((key, fields))
    return Answer(key_type, duration, tuple(pairs))


def cache_key(key_type: str, image: str) -> str:
    if key_type == "Image":
        return image
    if key_type == "Registry":
        return image.partition("/")[0]
    return GLOBAL_CACHE_KEY


# -- running a plugin ---------------------------------------------------------------------------------

async def run_plugin(provider: Provider, image: str, *, timeout: float = PLUGIN_TIMEOUT) -> bytes:
    """The plugin's stdout for a request about `image`; ProviderError when it fails."""
    request = orjson.dumps({"apiVersion": provider.api_version, "kind": REQUEST_KIND, "image": image})
    # subprocess (vfork), not the loop's create_subprocess_exec: uvloop fork()s, and a child forked while CRI calls
    # are in flight can die in gRPC's fork handlers before it execs (see kubeletapi/nodelogs.py).
    try:
        process = await asyncio.to_thread(
            subprocess.run, [provider.executable, *provider.args], input=request, capture_output=True,
            timeout=timeout, env={**os.environ, **provider.env})
    except OSError as err:
        raise ProviderError(f"credential provider {provider.name}: cannot run {provider.executable}: "
                            f"{err.strerror or err}") from None
    except subprocess.TimeoutExpired:  # subprocess.run killed and reaped it
        raise ProviderError(f"credential provider {provider.name}: no answer within {format_duration(timeout)}") \
            from None
    stdout, stderr = process.stdout, process.stderr
    if process.returncode != 0:
        # stderr is the plugin's own diagnostics; stdout (where credentials go) is never shown.
        said = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise ProviderError(f"credential provider {provider.name} exited with status {process.returncode}"
                            + (f": {said[0][:300]}" if said[0] else ""))
    if len(stdout) > MAX_RESPONSE_BYTES:
        raise ProviderError(f"credential provider {provider.name}: answer of more than {MAX_RESPONSE_BYTES} bytes")
    return stdout


Runner = Callable[[Provider, str], Awaitable[bytes]]


class ProviderKeyring:
    """Credentials from the plugins for an image, cached per the plugins' answers (`clock` for tests)."""

    def __init__(self, providers: Sequence[Provider], *, runner: Runner = run_plugin,
                 clock: Callable[[], float] = time.monotonic):
        self._providers = list(providers)
        self._runner = runner
        self._clock = clock
        # provider name -> cache key -> (expires at, answer)
        self._cache: dict[str, dict[str, tuple[float, Answer]]] = {p.name: {} for p in self._providers}
        self._running: dict[tuple[str, str], asyncio.Future[Answer]] = {}

    async def lookup(self, image: str) -> list[auth.AuthFields]:
        """Credentials for `image` (a repository like "host/path") from every matching provider, most specific
        registry key first; a provider that fails is logged and skipped."""
        try:
            ref = reference.parse(image)
        except reference.InvalidReference:
            return []
        repository = ref.repository
        pairs: list[tuple[auth.RegistryKey, auth.AuthFields]] = []
        for provider in self._providers:
            if not provider.matches(repository):
                continue
            try:
                pairs += (await self._answer(provider, repository)).auth
            except ProviderError as err:
                log.warning("no credentials for %s: %s", repository, err)
        return auth.matching_credentials(pairs, ref)

    def _cached(self, provider: Provider, image: str) -> Answer | None:
        cache, now = self._cache[provider.name], self._clock()
        for key_type in CACHE_KEY_TYPES:
            key = cache_key(key_type, image)
            entry = cache.get(key)
            if entry is not None and entry[1].cache_key_type == key_type:
                if entry[0] > now:
                    return entry[1]
                del cache[key]
        return None

    async def _answer(self, provider: Provider, image: str) -> Answer:
        if (answer := self._cached(provider, image)) is not None:
            return answer
        flight = (provider.name, image)
        if flight in self._running:  # one run answers every pull waiting for it
            return await asyncio.shield(self._running[flight])
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._running[flight] = future
        try:
            answer = await self._run(provider, image)
        except BaseException as err:
            future.set_exception(err if isinstance(err, ProviderError) else ProviderError(str(err) or "cancelled"))
            future.exception()  # retrieved: nobody else may be waiting
            raise
        finally:
            del self._running[flight]
        future.set_result(answer)
        return answer

    async def _run(self, provider: Provider, image: str) -> Answer:
        output = await self._runner(provider, image)
        try:
            answer = parse_response(output, provider.api_version)
        except ValueError as err:
            raise ProviderError(f"credential provider {provider.name}: {err}") from None
        duration = provider.default_cache_duration if answer.cache_duration is None else answer.cache_duration
        log.info("credential provider %s answered for %s (%d registries, kept %s per %s)", provider.name, image,
                 len(answer.auth), format_duration(duration), answer.cache_key_type.lower())
        if duration > 0:
            self._cache[provider.name][cache_key(answer.cache_key_type, image)] = (self._clock() + duration, answer)
        return answer
