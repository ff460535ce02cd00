"""nginx as the baseline proxy ``make bench`` measures the router beside."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx

from mcpfleet.dev.ports import free_port
from mcpfleet.dev.wait import wait_for


def start_nginx(workdir: Path, upstreams: list[str]) -> tuple[subprocess.Popen[bytes], int] | None:
    """nginx as a plain round-robin reverse proxy over the same replicas, if installed."""
    nginx = shutil.which("nginx") or (
        "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
    )
    if nginx is None:
        return None
    port = free_port()
    servers = "\n".join(f"    server {u.removeprefix('http://')};" for u in upstreams)
    conf = workdir / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
daemon off;
pid {workdir}/nginx.pid;
error_log {workdir}/nginx-error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {workdir}/body; proxy_temp_path {workdir}/proxy;
  fastcgi_temp_path {workdir}/fcgi; uwsgi_temp_path {workdir}/uwsgi; scgi_temp_path {workdir}/scgi;
  upstream replicas {{
{servers}
    keepalive 64;
  }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://replicas;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      # The client's Host (127.0.0.1:port), not the upstream group's name: the
      # replicas refuse Host names they do not serve (DNS-rebinding guard).
      proxy_set_header Host $http_host;
      proxy_buffering off;
    }}
  }}
}}
""")
    proc = subprocess.Popen(
        [nginx, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_for(
        lambda: httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200,
        timeout=15,
        what="nginx",
        retry_on=(httpx.HTTPError,),
    )
    return proc, port
