# Sourced by deploy/gpu/suite.sh and deploy/gpu/session.sh (from the repo root): installs the
# wheels of deploy/gpu/fetch_wheels.sh (in .whl/) into the interpreter's own site-packages and
# puts this checkout on a .pth file there, so every process started from python3 (children that
# scrub PYTHONPATH included) imports the project and its dependencies. Then checks that from a
# scrubbed environment in another folder.
kf_setup() {
  local py=${PYTHON:-python3} site
  unset PYTHONPATH
  if compgen -G ".whl/*.whl" >/dev/null; then
    PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
      "$py" -m pip install -q --no-index --no-deps --no-cache-dir .whl/*.whl \
      || { echo "kf_setup: installing .whl/*.whl failed" >&2; return 1; }
  else
    echo "kf_setup: no wheels in .whl/ (run deploy/gpu/fetch_wheels.sh and carry .whl)" >&2
  fi
  site=$("$py" -c 'import os, pydantic; print(os.path.dirname(os.path.dirname(pydantic.__file__)))') \
    || { echo "kf_setup: pydantic is not importable" >&2; return 1; }
  echo "$PWD" >"$site/kfoundry-checkout.pth"
  (cd / && env -i PATH="$PATH" HOME="${HOME:-/root}" "$py" -c '
import actors.cli, experience, faiss, gpu_runner.service, nats, openai, pydantic, schemas, structlog
print("kf_setup: imports ok from a scrubbed environment")') || { echo "kf_setup: import check failed" >&2; return 1; }
  command -v nats-server >/dev/null || "$py" -c 'import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("scripts"), "nats-server")))' \
    || { echo "kf_setup: nats-server not found" >&2; return 1; }
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 KFOUNDRY_HOME=${KFOUNDRY_HOME:-/tmp/kfhome}
}
