# Sourced by the image scripts: a containers.conf for buildah on machines like
# the CI's, where the defaults fail.
#
# - cgroups are a v1/v2 hybrid, which crun refuses: runtime = "runc";
# - RUN steps share the host's network (see netns below);
# - the build has no CAP_SYS_RESOURCE and a hard nofile limit of 20000, so the
#   default rlimits (nofile 1048576) are refused: ask for what the host allows.
#
# The file lives in .cache/image, so nothing under /etc is changed.
conf_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.cache/image"
mkdir -p "$conf_dir"
nofile="$(ulimit -Hn)"
nproc="$(ulimit -Hu)"
[[ "$nofile" == unlimited ]] && nofile=1048576
[[ "$nproc" == unlimited ]] && nproc=32768
((nproc > 32768)) && nproc=32768
cat >"$conf_dir/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
# Build steps use the host's network: no CNI bridge, iptables chains or
# forwarding sysctl is ever set up for them.
netns = "host"

[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF="$conf_dir/containers.conf"
export BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-oci}"
