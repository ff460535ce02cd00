"""ServiceAccounts and the namespaced RBAC that binds them, on a test's control plane.

Every rig that needs an account (the volume syncer, the rotator, the replica
Pods' own account, a test of one rule) makes it here, so an account is made
one way everywhere. Tokens for an account come from
:meth:`fleetkit.cluster.controlplane.ControlPlane.token_for_service_account`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kubernetes import client as k8s


def _create(create: Callable[[], object], *, exist_ok: bool) -> None:
    try:
        create()
    except k8s.ApiException as exc:
        if not (exist_ok and exc.status == 409):
            raise


def service_account(
    api: k8s.ApiClient,
    namespace: str,
    name: str,
    *,
    automount_token: bool | None = None,
    exist_ok: bool = False,
) -> None:
    """Create ServiceAccount ``name`` (an existing one is kept when ``exist_ok``).

    ``automount_token=False`` is the account of Pods that must not talk to the
    API at all; ``None`` leaves the field unset, as a bare manifest would.
    """
    meta = k8s.V1ObjectMeta(name=name)
    body = k8s.V1ServiceAccount(metadata=meta, automount_service_account_token=automount_token)
    core = k8s.CoreV1Api(api)
    _create(lambda: core.create_namespaced_service_account(namespace, body), exist_ok=exist_ok)


def service_account_with_rules(
    api: k8s.ApiClient,
    namespace: str,
    name: str,
    rules: Sequence[k8s.V1PolicyRule],
    *,
    exist_ok: bool = False,
) -> None:
    """Create ServiceAccount ``name`` bound to a Role ``name`` holding exactly ``rules``.

    With ``exist_ok``, each of the three objects that already exists is kept
    as it is (a rig set up again over the same namespace).
    """
    service_account(api, namespace, name, exist_ok=exist_ok)
    rbac = k8s.RbacAuthorizationV1Api(api)
    meta = k8s.V1ObjectMeta(name=name)
    role = k8s.V1Role(metadata=meta, rules=list(rules))
    binding = k8s.V1RoleBinding(
        metadata=meta,
        role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=name),
        subjects=[k8s.RbacV1Subject(kind="ServiceAccount", name=name, namespace=namespace)],
    )
    _create(lambda: rbac.create_namespaced_role(namespace, role), exist_ok=exist_ok)
    _create(lambda: rbac.create_namespaced_role_binding(namespace, binding), exist_ok=exist_ok)
