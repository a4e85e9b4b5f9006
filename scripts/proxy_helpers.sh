# Shell helpers shared by scripts/peers.sh and scripts/wrk_overhead.sh
# (sourced, not run): process groups started and stopped by id, free ports,
# CPU time of a process group from /proc, the canned answers of the instant
# nginx backend and the configs of the backend, nginx as a proxy and llmlb.
# Expects $OUT (where logs go) and, for the nginx configs, $TEMP.

PGIDS=()
cleanup() {
    local g
    for g in "${PGIDS[@]}"; do kill -TERM -- "-$g" 2>/dev/null; done
    sleep 0.5
    for g in "${PGIDS[@]}"; do kill -KILL -- "-$g" 2>/dev/null; done
    PGIDS=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME CMD...: runs CMD in a new process group, logs to $OUT/NAME.log,
# sets $PGID.
start() {
    local name="$1"
    shift
    setsid "$@" >"$OUT/$name.log" 2>&1 </dev/null &
    PGID=$!
    PGIDS+=("$PGID")
}

# stop PGID: stops one group started by `start`.
stop() {
    local g="$1" i left=()
    kill -TERM -- "-$g" 2>/dev/null
    for i in $(seq 50); do kill -0 -- "-$g" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$g" 2>/dev/null
    for i in "${PGIDS[@]}"; do [ "$i" != "$g" ] && left+=("$i"); done
    PGIDS=("${left[@]}")
}

# require_tools LLMLB TOOL...: exits with an install hint when a TOOL (a
# Debian package of the same name), nginx or the llmlb binary LLMLB is
# missing; sets $NGINX.
require_tools() {
    local llmlb="$1" tool
    shift
    for tool in "$@"; do
        command -v "$tool" >/dev/null || { echo "$tool is required (apt-get install $tool)" >&2; exit 1; }
    done
    NGINX="$(command -v nginx || echo /usr/sbin/nginx)"
    [ -x "$NGINX" ] || { echo "nginx is required (apt-get install nginx)" >&2; exit 1; }
    [ -x "$llmlb" ] || { echo "build llmlb first: cargo build --release" >&2; exit 1; }
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# cpu_ticks PGID: user+sys clock ticks of every live process in the group.
cpu_ticks() {
    local g="$1" f line rest total=0
    for f in /proc/[0-9]*/stat; do
        read -r line <"$f" 2>/dev/null || continue
        rest="${line##*) }"
        # shellcheck disable=SC2086
        set -- $rest
        [ "$3" = "$g" ] && total=$((total + ${12} + ${13}))
    done
    echo "$total"
}

# The canned answer in $SSE: 16 content chunks, a usage chunk, [DONE]
# (nginx turns each \n in a quoted string into a newline). With
# SSE_USAGE_NULL=1 each content chunk also carries `"usage":null`, as
# OpenAI's API (and servers that follow it) send them once
# `include_usage` is asked for; vLLM leaves the key out.
SSE=""
NULL_USAGE=""
[ "${SSE_USAGE_NULL:-0}" = 1 ] && NULL_USAGE=',"usage":null'
for i in $(seq 0 15); do
    SSE+='data: {"id":"cmpl-instant","object":"text_completion","choices":[{"index":0,"text":" t'$i'","finish_reason":null}]'"$NULL_USAGE"'}\n\n'
done
SSE+='data: {"id":"cmpl-instant","object":"text_completion","choices":[],"usage":{"prompt_tokens":16,"completion_tokens":16,"total_tokens":32}}\n\ndata: [DONE]\n\n'
# The same text as one JSON completion (249 bytes), for `x-answer: json`.
TEXT=""
for i in $(seq 0 15); do TEXT+=" t$i"; done
JSON='{"id":"cmpl-instant","object":"text_completion","model":"instant","choices":[{"index":0,"text":"'"$TEXT"'","finish_reason":"length"}],"usage":{"prompt_tokens":16,"completion_tokens":16,"total_tokens":32}}'

# nginx_common NAME: the top of an nginx config (pid and error log in $OUT).
nginx_common() {
    cat <<EOF
daemon off;
pid $OUT/$1.pid;
error_log $OUT/$1.error.log warn;
events { worker_connections 8192; }
EOF
}

# nginx_http_common: the start of its http block (temp paths under $TEMP).
nginx_http_common() {
    cat <<EOF
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  client_body_temp_path $TEMP/cb; proxy_temp_path $TEMP/pt; fastcgi_temp_path $TEMP/ft;
  uwsgi_temp_path $TEMP/ut; scgi_temp_path $TEMP/st;
EOF
}

# nginx_proxy_conf PORT BACKEND_PORT: nginx as a proxy on PORT in front of
# the backend (least_conn, kept-alive upstream connections, no buffering).
nginx_proxy_conf() {
    nginx_common nginx-proxy
    echo "worker_processes auto;"
    echo "http {"
    nginx_http_common
    cat <<EOF
  upstream instant {
    least_conn;
    server 127.0.0.1:$2;
    keepalive 128;
  }
  server {
    listen 127.0.0.1:$1;
    location / {
      proxy_pass http://instant;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
EOF
}

# llmlb_conf PORT BACKEND_URL [EXTRA TOML]: llmlb on PORT with one pool of
# one replica (the backend), least_connections.
llmlb_conf() {
    cat <<EOF
[server]
listen = "127.0.0.1:$1"
admin_listen = "127.0.0.1:$(free_port)"
${3:-}
[[pools]]
name = "instant"
models = ["instant"]
balancer = "least_connections"
[[pools.replicas]]
url = "$2"
EOF
}

# nginx_backend_conf PORT: the instant backend (one worker): the SSE
# answer, or the JSON one for a request with `x-answer: json`.
nginx_backend_conf() {
    nginx_common backend
    echo "worker_processes 1;"
    echo "http {"
    nginx_http_common
    cat <<EOF
  server {
    listen 127.0.0.1:$1;
    location = /health { return 200 ''; }
    location = /v1/models { default_type application/json; return 200 '{"object":"list","data":[{"id":"instant","object":"model"}]}'; }
    location = /json { default_type application/json; return 200 '$JSON'; }
    location / {
      if (\$http_x_answer = json) { rewrite ^ /json last; }
      default_type text/event-stream; return 200 '$SSE';
    }
  }
}
EOF
}
