"""RBAC is really enforced: a ServiceAccount gets exactly what its Role grants."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes import client as k8s

from fleetkit.cluster.controlplane import ControlPlane
from fleetkit.cluster.rbac import service_account_with_rules

pytestmark = pytest.mark.controlplane


def grant_one_secret(api: k8s.ApiClient, namespace: str, account: str, secret: str) -> None:
    """ServiceAccount ``account`` may get/watch/update Secret ``secret``, nothing else."""
    rule = k8s.V1PolicyRule(
        api_groups=[""],
        resources=["secrets"],
        resource_names=[secret],
        verbs=["get", "watch", "update"],
    )
    service_account_with_rules(api, namespace, account, [rule])


def _secret(name: str, value: str) -> k8s.V1Secret:
    return k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name), string_data={"value": value})


def test_service_account_reads_only_its_named_secret(
    control_plane: ControlPlane, admin_api: k8s.ApiClient, namespace: str
) -> None:
    admin = k8s.CoreV1Api(admin_api)
    admin.create_namespaced_secret(namespace, _secret("fleet-keys", "mine"))
    admin.create_namespaced_secret(namespace, _secret("other", "not mine"))
    grant_one_secret(admin_api, namespace, "syncer", "fleet-keys")

    sa = k8s.CoreV1Api(control_plane.api_client_for_service_account(namespace, "syncer"))

    # Allowed: the one named Secret, read and written.
    secret = sa.read_namespaced_secret("fleet-keys", namespace)
    assert secret.data is not None and "value" in secret.data
    secret.string_data = {"value": "updated"}
    sa.replace_namespaced_secret("fleet-keys", namespace, secret)

    # Refused: anything else, each with the API server's 403.
    refused: dict[str, Callable[[], object]] = {
        "list secrets": lambda: sa.list_namespaced_secret(namespace),
        "read another secret": lambda: sa.read_namespaced_secret("other", namespace),
        "create a configmap": lambda: sa.create_namespaced_config_map(
            namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="nope"))
        ),
        "delete its own secret": lambda: sa.delete_namespaced_secret("fleet-keys", namespace),
        "list secrets cluster-wide": lambda: sa.list_secret_for_all_namespaces(),
    }
    statuses = {}
    for what, call in refused.items():
        with pytest.raises(k8s.ApiException) as excinfo:
            call()
        statuses[what] = excinfo.value.status
    assert statuses == dict.fromkeys(refused, 403)


def test_service_account_kubeconfig_acts_as_the_account(
    control_plane: ControlPlane, admin_api: k8s.ApiClient, namespace: str
) -> None:
    grant_one_secret(admin_api, namespace, "reader", "fleet-keys")
    path = control_plane.kubeconfig_for_service_account(namespace, "reader")

    from kubernetes import config

    api = config.new_client_from_config(config_file=str(path))
    try:
        review = k8s.AuthenticationV1Api(api).create_self_subject_review(k8s.V1SelfSubjectReview())
    finally:
        api.close()
    assert review.status is not None and review.status.user_info is not None
    assert review.status.user_info.username == f"system:serviceaccount:{namespace}:reader"


def test_a_user_certificate_gets_only_its_groups_rights(
    control_plane: ControlPlane, admin_api: k8s.ApiClient, namespace: str
) -> None:
    from kubernetes import config

    rbac = k8s.RbacAuthorizationV1Api(admin_api)
    rbac.create_namespaced_role(
        namespace,
        k8s.V1Role(
            metadata=k8s.V1ObjectMeta(name="configmap-reader"),
            rules=[
                k8s.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["get", "list"])
            ],
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        k8s.V1RoleBinding(
            metadata=k8s.V1ObjectMeta(name="viewers"),
            role_ref=k8s.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="configmap-reader"
            ),
            subjects=[
                k8s.RbacV1Subject(
                    kind="Group", name="viewers", api_group="rbac.authorization.k8s.io"
                )
            ],
        ),
    )
    path = control_plane.kubeconfig_for_user("alice", groups=("viewers",))
    api = config.new_client_from_config(config_file=str(path))
    try:
        core = k8s.CoreV1Api(api)
        assert core.list_namespaced_config_map(namespace).items is not None
        with pytest.raises(k8s.ApiException) as refused:
            core.create_namespaced_config_map(
                namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="nope"))
            )
        assert refused.value.status == 403
    finally:
        api.close()
