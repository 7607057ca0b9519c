#!/usr/bin/env bash
# Create, set up, run on, watch and delete a Cloud TPU VM or pod slice.
# Run with --help for the commands and options; DRY_RUN=1 prints every command instead of running it.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: ./launch_tpu.sh COMMAND --name NAME --zone ZONE [options] [-- TRAIN_ARGS...]

Commands
  create   create the TPU VM / pod slice (--type, --version; --spot or --queued use queued-resources)
  setup    copy this repository (its git-tracked files) to every worker and install
           requirements-tpu.txt (requirements.txt plus jax[tpu]) into ~/REPO_DIR/.venv on each
  run      start `python -m pretrain.train --workdir=WORKDIR TRAIN_ARGS...` on all workers
           in the background (same command on every host), output to --log on each worker;
           given --type, first compile the run's step for that slice here (`pretrain.train
           --compile_for=TYPE`, needs libtpu: requirements-tpu.txt) and start nothing if it
           does not fit or compile
  tail     follow worker 0's log
  ssh      open a shell on a worker (--worker, default 0)
  stop     send SIGTERM to the training process on all workers (`run` again resumes from
           the last checkpoint)
  delete   delete the TPU VM (or its queued resource)

Options
  --name NAME        TPU name (or $TPU_NAME)
  --zone ZONE        e.g. us-central2-b (or $TPU_ZONE)
  --project ID       GCP project (default: gcloud's configured project)
  --type TYPE        accelerator type for create, e.g. v4-8, v4-32, v5p-128 (default v4-8);
                     for run, the slice to compile the step for before starting it
  --no-check         run: skip that compile check
  --version VERSION  TPU runtime version for create (default tpu-ubuntu2204-base)
  --spot             create as a spot (preemptible) slice through queued-resources
  --queued           create through queued-resources (waits for capacity)
  --workdir PATH     run: the workdir, normally gs://BUCKET/RUN (required for run)
  --repo-dir DIR     directory of the code on the workers (default encoder-pretraining)
  --log FILE         log file on each worker (default train.log, relative to the home directory)
  --worker N         ssh: which worker (default 0)
  -h, --help         this text

Environment
  DRY_RUN=1          print every command instead of running it
  PYTHON             the Python of this machine's compile check (default python3)

Example (BERT-base on a v4-32):
  ./launch_tpu.sh create --name bert --zone us-central2-b --type v4-32 --spot
  ./launch_tpu.sh setup  --name bert --zone us-central2-b
  ./launch_tpu.sh run    --name bert --zone us-central2-b --type v4-32 --workdir gs://my-bucket/bert_base -- \
      --gin_file=configs/runs/bert_base_wikipedia.gin --gin_bindings="run.data_dir='gs://my-bucket/shards'"
  ./launch_tpu.sh tail   --name bert --zone us-central2-b
  ./launch_tpu.sh delete --name bert --zone us-central2-b
EOF
}

LIBTPU_INDEX="https://storage.googleapis.com/jax-releases/libtpu_releases.html"

die() {
  echo "error: $*" >&2
  exit 2
}

# Runs a command, or prints it (shell-quoted, one line) under DRY_RUN=1.
run_cmd() {
  if [[ "${DRY_RUN:-0}" == "1" ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

command="${1:-}"
if [[ -z "$command" || "$command" == "-h" || "$command" == "--help" ]]; then
  usage
  exit 0
fi
shift

name="${TPU_NAME:-}"
zone="${TPU_ZONE:-}"
project=""
tpu_type="v4-8"
type_given=0
check=1
version="tpu-ubuntu2204-base"
spot=0
queued=0
workdir=""
repo_dir="encoder-pretraining"
log_file="train.log"
worker="0"
train_args=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) name="${2:?--name needs a value}"; shift 2 ;;
    --zone) zone="${2:?--zone needs a value}"; shift 2 ;;
    --project) project="${2:?--project needs a value}"; shift 2 ;;
    --type) tpu_type="${2:?--type needs a value}"; type_given=1; shift 2 ;;
    --no-check) check=0; shift ;;
    --version) version="${2:?--version needs a value}"; shift 2 ;;
    --spot) spot=1; shift ;;
    --queued) queued=1; shift ;;
    --workdir) workdir="${2:?--workdir needs a value}"; shift 2 ;;
    --repo-dir) repo_dir="${2:?--repo-dir needs a value}"; shift 2 ;;
    --log) log_file="${2:?--log needs a value}"; shift 2 ;;
    --worker) worker="${2:?--worker needs a value}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; train_args=("$@"); break ;;
    *) die "unknown option '$1' (see ./launch_tpu.sh --help)" ;;
  esac
done

[[ -n "$name" ]] || die "--name is required (or set TPU_NAME)"
[[ -n "$zone" ]] || die "--zone is required (or set TPU_ZONE)"
where=(--zone="$zone")
[[ -n "$project" ]] && where+=(--project="$project")

tpu_ssh() {  # tpu_ssh WORKER COMMAND
  run_cmd gcloud compute tpus tpu-vm ssh "$name" "${where[@]}" --worker="$1" --command="$2"
}

case "$command" in
  create)
    if [[ $spot == 1 || $queued == 1 ]]; then
      extra=()
      [[ $spot == 1 ]] && extra+=(--spot)
      run_cmd gcloud compute tpus queued-resources create "$name" --node-id="$name" "${where[@]}" \
        --accelerator-type="$tpu_type" --runtime-version="$version" "${extra[@]}"
      echo "queued; check with: gcloud compute tpus queued-resources describe $name --zone=$zone" >&2
    else
      run_cmd gcloud compute tpus tpu-vm create "$name" "${where[@]}" \
        --accelerator-type="$tpu_type" --version="$version"
    fi
    ;;
  setup)
    archive="${TMPDIR:-/tmp}/$name-code.tar.gz"
    run_cmd git archive --format=tar.gz --output="$archive" HEAD
    run_cmd gcloud compute tpus tpu-vm scp "$archive" "$name":code.tar.gz "${where[@]}" --worker=all
    tpu_ssh all "mkdir -p $repo_dir && tar xzf code.tar.gz -C $repo_dir && cd $repo_dir \
&& python3 -m venv .venv && .venv/bin/pip install --quiet -r requirements-tpu.txt -f $LIBTPU_INDEX"
    ;;
  run)
    [[ -n "$workdir" ]] || die "run needs --workdir (a gs:// path, shared by all workers)"
    if [[ $type_given == 1 && $check == 1 ]]; then
      # The step compiled for the slice on this machine first (pretrain/tpu_compile.py): a
      # config that does not fit is refused here, in one line, before the workers start.
      run_cmd "${PYTHON:-python3}" -m pretrain.train --compile_for="$tpu_type" --workdir="$workdir" \
        ${train_args[@]+"${train_args[@]}"} || exit $?
    fi
    quoted_args=""
    [[ ${#train_args[@]} -gt 0 ]] && quoted_args="$(printf '%q ' "${train_args[@]}")"
    tpu_ssh all "cd $repo_dir && nohup .venv/bin/python -m pretrain.train --workdir=$workdir \
$quoted_args> ~/$log_file 2>&1 &"
    ;;
  tail)
    tpu_ssh 0 "tail -n 200 -f ~/$log_file"
    ;;
  ssh)
    run_cmd gcloud compute tpus tpu-vm ssh "$name" "${where[@]}" --worker="$worker"
    ;;
  stop)
    tpu_ssh all "pkill -TERM -f 'python -m pretrain.train' || true"
    ;;
  delete)
    if [[ $spot == 1 || $queued == 1 ]]; then
      run_cmd gcloud compute tpus queued-resources delete "$name" "${where[@]}" --force --quiet
    else
      run_cmd gcloud compute tpus tpu-vm delete "$name" "${where[@]}" --quiet
    fi
    ;;
  *)
    die "unknown command '$command': use create, setup, run, tail, ssh, stop or delete (see --help)"
    ;;
esac
