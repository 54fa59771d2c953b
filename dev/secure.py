"""The secured embedded stack: SASL_SSL (SCRAM-SHA-512 over TLS) and Kafka's StandardAuthorizer.

What ``delayq dev up --secure`` adds to the plain stack, all kept in ``<state>/secure/``::

    secrets.json   the generated passwords (mode 0600): the admin super-user's, the controller
                   listener's, the key stores', ZooKeeper's digest credentials, and each user's
    ca.pem         the stack's own certificate authority, which every client trusts
    ca.p12         the authority's key (only ever used to sign the broker's certificate)
    broker.p12     the broker's key and certificate (SAN 127.0.0.1 and localhost), signed by the CA

The broker's client listener speaks SASL_SSL with SCRAM-SHA-512 only; its controller
listener, loopback-only, speaks SASL_PLAINTEXT with one static PLAIN user. ACLs are
enforced (``StandardAuthorizer``, nothing allowed where no ACL is found) for everyone but
the ``admin`` super-user. The certificates come from Java's own ``keytool``: Java is needed
for Kafka anyway, so the secured stack needs nothing more installed.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .runtime import StackError

MECHANISM = "SCRAM-SHA-512"
PROTOCOL = "SASL_SSL"
ADMIN = "admin"
# The static PLAIN user the broker half of the node authenticates as to its controller half.
CONTROLLER = "controller"
ZK_USER = "delayq"
# The stack's own names: `delayq dev user` refuses them.
RESERVED_USERS = frozenset({ADMIN, CONTROLLER})
# SCRAM user names delayq's dev stack creates: plain enough for a shell export line and an ACL principal.
USER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
FOLDER = "secure"
CERT_DAYS = 3650


def new_password() -> str:
    # URL-safe letters only: they go into JAAS strings and shell export lines unquoted.
    return secrets.token_urlsafe(24)


@dataclass
class Secrets:
    """The secured stack's generated credentials, kept in ``<state>/secure/secrets.json`` (mode 0600)."""

    admin_password: str = field(default_factory=new_password)
    controller_password: str = field(default_factory=new_password)
    store_password: str = field(default_factory=new_password)
    zk_password: str = field(default_factory=new_password)
    users: dict[str, str] = field(default_factory=dict)

    @property
    def zk_auth(self) -> str:
        """ZooKeeper digest credentials for the stack's delayq nodes."""
        return f"{ZK_USER}:{self.zk_password}"

    @classmethod
    def path(cls, state_dir: Path) -> Path:
        return state_dir / FOLDER / "secrets.json"

    @classmethod
    def load(cls, state_dir: Path) -> Secrets | None:
        try:
            return cls(**json.loads(cls.path(state_dir).read_text()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as err:
            raise StackError(f"the secured stack's credentials {cls.path(state_dir)} cannot be read ({err}): wipe "
                             f"the stack (delayq dev down --wipe --state-dir {state_dir}) and start it again") from None

    @classmethod
    def load_or_create(cls, state_dir: Path) -> Secrets:
        found = cls.load(state_dir)
        if found is not None:
            return found
        created = cls()
        created.save(state_dir)
        return created

    def save(self, state_dir: Path) -> None:
        path = self.path(state_dir)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        scratch = path.with_suffix(".tmp")
        # Created private: the file holds every password of the stack.
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(self), out, indent=2)
        scratch.replace(path)


def ca_file(state_dir: Path) -> Path:
    return state_dir / FOLDER / "ca.pem"


def broker_keystore(state_dir: Path) -> Path:
    return state_dir / FOLDER / "broker.p12"


def ensure_certificates(state_dir: Path, java: str, store_password: str) -> None:
    """A CA and a broker certificate it signed (for 127.0.0.1 and localhost), made once with keytool.

    Raises:
        StackError: keytool is missing or failed; the message quotes what it said.
    """
    folder = state_dir / FOLDER
    if ca_file(state_dir).exists() and broker_keystore(state_dir).exists():
        return
    keytool = str(Path(java).parent / "keytool")
    if not Path(keytool).exists():
        raise StackError(f"keytool, which makes the secured stack's certificates, is not next to {java}: "
                         "install a full Java 17+ (Debian: apt-get install openjdk-17-jre-headless)")
    for stale in ("ca.p12", "ca.pem", "broker.p12", "broker.csr", "broker.pem"):
        (folder / stale).unlink(missing_ok=True)
    store = ["-storetype", "PKCS12", "-storepass", store_password]
    ca, broker = str(folder / "ca.p12"), str(broker_keystore(state_dir))
    key = ["-keyalg", "RSA", "-keysize", "2048", "-validity", str(CERT_DAYS)]
    steps = [
        ["-genkeypair", "-alias", "ca", "-dname", "CN=delayq dev CA", "-ext", "bc:c", *key, "-keystore", ca, *store],
        ["-exportcert", "-alias", "ca", "-rfc", "-file", str(ca_file(state_dir)), "-keystore", ca, *store],
        ["-genkeypair", "-alias", "broker", "-dname", "CN=localhost", *key, "-keystore", broker, *store],
        ["-certreq", "-alias", "broker", "-file", str(folder / "broker.csr"), "-keystore", broker, *store],
        ["-gencert", "-alias", "ca", "-infile", str(folder / "broker.csr"), "-outfile", str(folder / "broker.pem"),
         "-rfc", "-ext", "SAN=IP:127.0.0.1,DNS:localhost", "-validity", str(CERT_DAYS), "-keystore", ca, *store],
        ["-importcert", "-alias", "ca", "-file", str(ca_file(state_dir)), "-noprompt", "-keystore", broker, *store],
        ["-importcert", "-alias", "broker", "-file", str(folder / "broker.pem"), "-keystore", broker, *store],
    ]
    for step in steps:
        done = subprocess.run([keytool, *step], capture_output=True, text=True)
        if done.returncode != 0:
            for partial in ("ca.p12", "ca.pem", "broker.p12"):
                (folder / partial).unlink(missing_ok=True)
            said = " ".join((done.stderr or done.stdout).split())[:300] or "nothing"
            raise StackError(f"keytool {step[0]} failed making the secured stack's certificates (exit "
                             f"{done.returncode}; it said: {said}); fix that and run delayq dev up --secure again")


def kafka_properties(state_dir: Path, secrets_: Secrets) -> dict[str, str]:
    """The broker settings that secure it, on top of the plain stack's (listeners are set by the caller)."""
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
    controller = secrets_.controller_password
    return {
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config":
            f'{scram} required username="{ADMIN}" password="{secrets_.admin_password}";',
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config":
            f'{plain} required username="{CONTROLLER}" password="{controller}" user_{CONTROLLER}="{controller}";',
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(broker_keystore(state_dir)),
        "ssl.keystore.password": secrets_.store_password,
        "ssl.key.password": secrets_.store_password,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca_file(state_dir)),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{ADMIN};User:{CONTROLLER}",
    }


def scram_bootstrap(secrets_: Secrets) -> list[str]:
    """StorageTool arguments that create the admin's SCRAM credentials with the cluster's first metadata."""
    return ["--add-scram", f"{MECHANISM}=[name={ADMIN},password={secrets_.admin_password}]"]


def client_conf(state_dir: Path, user: str, password: str) -> dict[str, str]:
    """librdkafka settings for ``user`` on the secured stack (without bootstrap.servers)."""
    return {
        "security.protocol": PROTOCOL,
        "sasl.mechanisms": MECHANISM,
        "sasl.username": user,
        "sasl.password": password,
        "ssl.ca.location": str(ca_file(state_dir)),
    }


def check_user_name(name: str) -> None:
    """Raises: StackError: ``name`` is reserved or not a plain user name."""
    if name in RESERVED_USERS:
        raise StackError(f"user {name!r} is the secured stack's own: delayq dev env --secure prints the admin's "
                         "settings; choose another name")
    if not USER_NAME.fullmatch(name):
        raise StackError(f"user name {name!r} is not allowed: use letters, digits, '.', '_' and '-' (up to 64), "
                         "starting with a letter or digit")


def upsert_scram_user(bootstrap_servers: str, admin_conf: dict[str, str], name: str, password: str) -> None:
    """Create (or set again) ``name``'s SCRAM-SHA-512 credentials through the Admin API, as the admin.

    Raises:
        StackError: the broker refused or did not answer.
    """
    from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    admin = AdminClient({"bootstrap.servers": bootstrap_servers, **admin_conf})
    upsertion = UserScramCredentialUpsertion(name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                             password.encode())
    try:
        for future in admin.alter_user_scram_credentials([upsertion]).values():
            future.result(timeout=30)
    except Exception as err:
        raise StackError(f"creating SCRAM user {name} on {bootstrap_servers} failed ({err}): is the secured stack "
                         "up? (delayq dev status --secure)") from None
