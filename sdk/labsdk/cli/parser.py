"""The ``lab`` argument parser: every command and its options; each command sets ``handler``."""

from __future__ import annotations

import argparse

from labsdk._version import __version__
from labsdk.cli._options import (
    _add_secret_options,
    _add_wait_options,
    _dataset_name,
    _environment_id,
    _model_id,
    _positive_int,
)
from labsdk.cli.catalog import (
    billing_balance,
    datasets,
    datasets_delete,
    datasets_get,
    datasets_push,
    envs,
    envs_build_log,
    envs_delete,
    envs_info,
    envs_push,
    envs_rebuild,
    models,
    models_build_log,
    models_get,
    models_push,
    prices,
    usage,
)
from labsdk.cli.deployments import deploy, deployments_delete, deployments_get, deployments_list
from labsdk.cli.evals import (
    checkpoints_eval,
    evals_cancel,
    evals_delete,
    evals_get,
    evals_list,
    evals_push,
    evals_retry,
    evals_run,
    evals_samples,
    examples_count,
)
from labsdk.cli.jobs import (
    adapters_download,
    adapters_list,
    checkpoints_download,
    jobs_cancel,
    jobs_checkpoints,
    jobs_compare,
    jobs_create,
    jobs_delete,
    jobs_distributions,
    jobs_events,
    jobs_get,
    jobs_list,
    jobs_logs,
    jobs_metrics,
    jobs_restart,
    jobs_samples,
    jobs_wait,
    jobs_watch,
)
from labsdk.cli.project import (
    webhooks_create,
    webhooks_delete,
    webhooks_deliveries,
    webhooks_list,
    webhooks_rotate_secret,
    webhooks_test,
    whoami,
)
from labsdk.cli.sandboxes import add_sandboxes_parser
from labsdk.cli.spec import spec_check, spec_init, spec_schema
from labsdk.cli.try_environment import envs_try
from labsdk.display import MAIN_METRICS
from labsdk.spec_template import DEFAULT_ENV, DEFAULT_MODEL


def build_parser() -> argparse.ArgumentParser:
    """Return the ``lab`` argument parser; each command sets ``handler``."""
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument("--json", action="store_true", help="print JSON for scripts instead of tables")

    parser = argparse.ArgumentParser(prog="lab", description="Lab, hosted reinforcement learning, from the terminal.",
                                     epilog="Reads LAB_API_KEY and LAB_BASE_URL (default http://127.0.0.1:8000).")
    parser.add_argument("--version", action="version", version=f"labsdk {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    jobs = commands.add_parser("jobs", parents=[json_flag], help="create, list, inspect, cancel and wait for jobs",
                               epilog="Without a command: list.")
    jobs.set_defaults(handler=jobs_list, status=None, kind=None, metadata=None, limit=20)
    job_commands = jobs.add_subparsers(dest="job_command", metavar="COMMAND")

    create = job_commands.add_parser("create", parents=[json_flag], help="submit a job from a spec file; prints its id")
    create.add_argument("-f", "--file", required=True, help="job spec, TOML (or JSON with a .json suffix)")
    create.add_argument("--name", help="job name, overriding the file's")
    _add_secret_options(create)
    _add_wait_options(create, "then wait for it to finish (exit 1 unless it succeeds)")
    create.set_defaults(handler=jobs_create)

    listing = job_commands.add_parser("list", parents=[json_flag], help="list jobs, newest first")
    listing.add_argument("--status", help="only jobs in this status (queued, running, succeeded, ...)")
    listing.add_argument(
        "--kind", choices=("training", "evaluation"), help="training jobs (the default) or the jobs of evaluations"
    )
    listing.add_argument("--metadata", action="append", metavar="KEY=VALUE", help="only jobs with this metadata pair")
    listing.add_argument("--limit", type=_positive_int, default=20, help="most jobs shown (default 20)")
    listing.set_defaults(handler=jobs_list)

    for name, handler, help_text in (
        ("get", jobs_get, "show one job"),
        ("cancel", jobs_cancel, "cancel a job"),
        ("restart", jobs_restart, "run a failed or cancelled job again from its latest checkpoint"),
        ("delete", jobs_delete, "delete a finished job and its data"),
        ("events", jobs_events, "show a job's events"),
        ("checkpoints", jobs_checkpoints, "list a job's checkpoints"),
    ):
        command = job_commands.add_parser(name, parents=[json_flag], help=help_text)
        command.add_argument("id", help="job id (job_...)")
        command.set_defaults(handler=handler)

    logs = job_commands.add_parser("logs", parents=[json_flag], help="print a job's log lines")
    logs.add_argument("id", help="job id (job_...)")
    logs.add_argument("-f", "--follow", action="store_true",
                      help="follow the live stream until the job finishes (JSON lines with --json)")
    logs.set_defaults(handler=jobs_logs)

    watch = job_commands.add_parser("watch", parents=[json_flag],
                                    help="follow a job live: status and latest metrics, until it ends")
    watch.add_argument("id", help="job id (job_...)")
    watch.set_defaults(handler=jobs_watch)

    wait = job_commands.add_parser("wait", parents=[json_flag], help="wait for a job to finish, with a progress bar")
    wait.add_argument("id", help="job id (job_...)")
    _add_wait_options(wait)
    wait.set_defaults(handler=jobs_wait)

    metrics = job_commands.add_parser("metrics", parents=[json_flag], help="show a job's metrics per step")
    metrics.add_argument("id", help="job id (job_...)")
    chosen = metrics.add_mutually_exclusive_group()
    chosen.add_argument("--names", help=f"comma-separated metric names (default: {', '.join(MAIN_METRICS)})")
    chosen.add_argument("--all", action="store_true", help="every metric the job recorded")
    metrics.add_argument("--long", action="store_true", help="one row per step and metric (step, name, value)")
    metrics.set_defaults(handler=jobs_metrics)

    samples = job_commands.add_parser("samples", parents=[json_flag], help="show a job's rollout samples")
    samples.add_argument("id", help="job id (job_...)")
    samples.add_argument("--step", type=int, help="training step (default: the latest with samples)")
    samples.add_argument("--limit", type=_positive_int, default=20, help="most samples shown (default 20)")
    samples.add_argument("--prompt", action="store_true", help="show each sample's prompt too")
    samples.set_defaults(handler=jobs_samples)

    compare = job_commands.add_parser("compare", parents=[json_flag], help="jobs' final metrics side by side")
    compare.add_argument("ids", nargs="+", metavar="ID", help="job ids (job_...)")
    chosen = compare.add_mutually_exclusive_group()
    chosen.add_argument("--names", help=f"comma-separated metric names (default: {', '.join(MAIN_METRICS)})")
    chosen.add_argument("--all", action="store_true", help="every metric the jobs recorded")
    compare.set_defaults(handler=jobs_compare)

    distributions = job_commands.add_parser(
        "distributions", parents=[json_flag], help="histogram of one step's rollout rewards or advantages"
    )
    distributions.add_argument("id", help="job id (job_...)")
    distributions.add_argument("--step", type=int, help="training step (default: the latest with rollouts)")
    distributions.add_argument("--type", choices=("reward", "advantage"), default="reward", help="default: reward")
    distributions.add_argument("--bins", type=_positive_int, default=10, help="number of bins (default 10, at most 100)")
    distributions.set_defaults(handler=jobs_distributions)

    checkpoints = commands.add_parser("checkpoints", help="list and download checkpoints")
    checkpoint_commands = checkpoints.add_subparsers(dest="checkpoint_command", required=True, metavar="COMMAND")
    listing = checkpoint_commands.add_parser("list", parents=[json_flag], help="list a job's checkpoints, newest first")
    listing.add_argument("id", help="job id (job_...)")
    listing.set_defaults(handler=jobs_checkpoints)
    download = checkpoint_commands.add_parser(
        "download", parents=[json_flag], help="unpack a ready checkpoint into a directory (or save its tar with --tar)"
    )
    download.add_argument("id", help="checkpoint id (ckpt_...)")
    download.add_argument("-o", "--output", help="directory to unpack into (default ID/), or with --tar the file (default ID.tar)")
    download.add_argument("--tar", action="store_true", help="save the uncompressed tar archive instead of unpacking it")
    download.set_defaults(handler=checkpoints_download)
    evaluate = checkpoint_commands.add_parser(
        "eval", parents=[json_flag], help="evaluate a ready checkpoint on environments (lab evals run --checkpoint ID)"
    )
    evaluate.add_argument("id", help="checkpoint id (ckpt_...)")
    _add_evaluation_options(evaluate)
    evaluate.set_defaults(handler=checkpoints_eval, model=None)

    adapters = commands.add_parser("adapters", help="list and download adapter artifacts ([adapters] in the spec)")
    adapter_commands = adapters.add_subparsers(dest="adapter_command", required=True, metavar="COMMAND")
    listing = adapter_commands.add_parser("list", parents=[json_flag], help="list a job's adapters, newest first")
    listing.add_argument("job", help="job id (job_...)")
    listing.set_defaults(handler=adapters_list)
    download = adapter_commands.add_parser(
        "download", parents=[json_flag], help="unpack a ready adapter into a directory, its SHA-256 checked"
    )
    download.add_argument("id", help="adapter id (adp_...)")
    download.add_argument("--dir", help="directory to unpack into (default ID/)")
    download.set_defaults(handler=adapters_download)

    spec = commands.add_parser(
        "spec", help="write, check and look up job spec files",
        epilog="Model ids: `lab models`; environment ids and their arguments: `lab envs`; "
               "every key: `lab spec schema --fields` (and docs/spec.md).",
    )
    spec_commands = spec.add_subparsers(dest="spec_command", required=True, metavar="COMMAND")
    init = spec_commands.add_parser(
        "init", help="write a commented spec template that passes `lab spec check` as written",
        epilog="Model ids: `lab models`; environment ids: `lab envs`.",
    )
    init.add_argument("file", nargs="?", help="where to write it (default: print it)")
    init.add_argument("--model", default=DEFAULT_MODEL, help=f"model catalogue id, see `lab models` (default {DEFAULT_MODEL})")
    init.add_argument("--environment", default=DEFAULT_ENV, metavar="ID",
                      help=f"environment id, see `lab envs` (default {DEFAULT_ENV})")
    init.add_argument("--multi-turn", action="store_true",
                      help="write the episode limits of a multi-turn environment (max_turns, token caps, timeout); "
                      "with LAB_API_KEY Lab says whether it is one")
    init.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    init.set_defaults(handler=spec_init)
    schema = spec_commands.add_parser(
        "schema", parents=[json_flag],
        help="print the job spec's JSON Schema (also at /api/v1/schema/job-spec.json), or --fields a table of every key",
    )
    schema.add_argument("--fields", action="store_true", help="a table of every key: type, default, meaning")
    schema.set_defaults(handler=spec_schema)
    check = spec_commands.add_parser(
        "check", parents=[json_flag],
        help="validate a spec file locally, then through Lab's estimate when LAB_API_KEY is set",
    )
    check.add_argument("file", help="job spec, TOML (or JSON with a .json suffix)")
    _add_secret_options(check)
    check.set_defaults(handler=spec_check)

    usage_command = commands.add_parser("usage", parents=[json_flag], help="show the project's usage and cost")
    usage_command.add_argument("--start", help="from this date or ISO 8601 time (default 30 days ago)")
    usage_command.add_argument("--end", help="until this date or time, excluded (default now)")
    usage_command.add_argument("--group-by", default="day", help="day, resource, job, or several joined by commas")
    usage_command.add_argument("--job", help="only this job's usage")
    usage_command.set_defaults(handler=usage)
    billing = commands.add_parser("billing", parents=[json_flag], help="the organization's balance and spend",
                                  epilog="Without a command: the balance.")
    billing.set_defaults(handler=billing_balance)
    billing_commands = billing.add_subparsers(dest="billing_command", metavar="COMMAND")
    billing_commands.add_parser("balance", parents=[json_flag], help="plan, balance, spend limit and this month's spend").set_defaults(handler=billing_balance)

    for name, handler, help_text in (
        ("prices", prices, "show the price table (USD per hour per GPU, or per CPU job)"),
        ("whoami", whoami, "show the organization, project and scopes of the API key"),
    ):
        commands.add_parser(name, parents=[json_flag], help=help_text).set_defaults(handler=handler)

    model_parser = commands.add_parser(
        "models", parents=[json_flag], help="list, push and inspect models (a spec's `model`)",
        epilog="Without a command: list. Only ready models train. docs/models.md.",
    )
    model_parser.set_defaults(handler=models)
    model_commands = model_parser.add_subparsers(dest="model_command", metavar="COMMAND")
    model_commands.add_parser("list", parents=[json_flag], help="the models offered to everyone and the organization's own").set_defaults(handler=models)
    model_push = model_commands.add_parser(
        "push", parents=[json_flag], help="upload a Hugging Face model directory as one of the organization's models",
        epilog="Lab checks it in a worker: safetensors only, an architecture the engine trains, the tokenizer loads.",
    )
    model_push.add_argument("directory", help="the model directory (config.json, *.safetensors, tokenizer files)")
    model_push.add_argument("--name", required=True, help="its id: <organization slug>/<name>")
    model_push.add_argument("--wait", action="store_true", help="wait until its check has passed (exit 1 when it fails)")
    model_push.add_argument("--timeout", type=float, default=1800.0, help="seconds --wait waits (default 1800)")
    model_push.set_defaults(handler=models_push)
    model_get = model_commands.add_parser("get", parents=[json_flag], help="show one model and its latest check")
    model_get.add_argument("id", type=_model_id, help="<owner>/<name>")
    model_get.set_defaults(handler=models_get)
    model_log = model_commands.add_parser("build-log", help="print the log of a pushed model's latest check")
    model_log.add_argument("id", type=_model_id, help="<owner>/<name>")
    model_log.set_defaults(handler=models_build_log)

    dataset_parser = commands.add_parser(
        "datasets", parents=[json_flag], help="push, list and delete the datasets load_dataset(\"owner/name\") reads in builds and jobs",
        epilog="Without a command: list. Builds and jobs load environments offline: a dataset an environment loads by "
               "name must be pushed first. docs/environments.md \"Datasets\".",
    )
    dataset_parser.set_defaults(handler=datasets)
    dataset_commands = dataset_parser.add_subparsers(dest="dataset_command", metavar="COMMAND")
    dataset_commands.add_parser("list", parents=[json_flag], help="the organization's pushed datasets").set_defaults(handler=datasets)
    dataset_push = dataset_commands.add_parser(
        "push", parents=[json_flag], help="push a folder, an archive or a data file as the dataset OWNER/NAME (replacing it)",
    )
    dataset_push.add_argument("name", metavar="OWNER/NAME", help="the name load_dataset is called with, e.g. acme/arith")
    dataset_push.add_argument("path", metavar="DIR|FILE", help="the dataset's folder (train.jsonl, data/test-*.parquet, ...), a .tar/.tar.gz/.zip of it, or one data file")
    dataset_push.set_defaults(handler=datasets_push)
    dataset_get = dataset_commands.add_parser("get", parents=[json_flag], help="show one pushed dataset and its files")
    dataset_get.add_argument("name", type=_dataset_name, metavar="OWNER/NAME")
    dataset_get.set_defaults(handler=datasets_get)
    dataset_delete = dataset_commands.add_parser("delete", parents=[json_flag], help="delete a pushed dataset")
    dataset_delete.add_argument("name", type=_dataset_name, metavar="OWNER/NAME")
    dataset_delete.set_defaults(handler=datasets_delete)

    environments = commands.add_parser(
        "envs", parents=[json_flag], help="list, push, inspect and delete environments (a spec's `[[env]] id`)",
        epilog="Without a command: list. An id reads <organization>/<name>[@<version>]; no version means the latest.",
    )
    environments.set_defaults(handler=envs)
    env_commands = environments.add_subparsers(dest="env_command", metavar="COMMAND")
    env_commands.add_parser("list", parents=[json_flag], help="built-ins and the organization's packages").set_defaults(handler=envs)
    push = env_commands.add_parser("push", parents=[json_flag], help="upload an environment wheel (.whl, at most 100 MB) or build one from its project folder")
    push.add_argument("wheel", metavar="WHEEL_OR_FOLDER", help="the wheel file (dist/my_env-0.1.0-py3-none-any.whl) or the project folder (./my-env), built as lab envs try builds it")
    push.set_defaults(handler=envs_push)
    info = env_commands.add_parser("info", parents=[json_flag], help="show one package version and its latest build")
    info.add_argument("id", type=_environment_id, help="<organization>/<name>[@<version>]")
    info.set_defaults(handler=envs_info)
    build_log = env_commands.add_parser("build-log", help="print the log of a package version's latest build")
    build_log.add_argument("id", type=_environment_id, help="<organization>/<name>[@<version>]")
    build_log.set_defaults(handler=envs_build_log)
    rebuild = env_commands.add_parser(
        "rebuild", parents=[json_flag], help="build a package version again against the package index as it is now",
    )
    rebuild.add_argument("id", type=_environment_id, help="<organization>/<name>[@<version>]")
    rebuild.set_defaults(handler=envs_rebuild)
    delete = env_commands.add_parser("delete", parents=[json_flag], help="delete one package version (never reused)")
    delete.add_argument("id", type=_environment_id, help="<organization>/<name>[@<version>]")
    delete.set_defaults(handler=envs_delete)
    trying = env_commands.add_parser(
        "try", parents=[json_flag], help="load a package as a job would, before pushing it: its examples and scores (no Lab needed)",
        epilog="The package runs in the engine of this Lab checkout, installed as a job installs it; --args are checked "
               "as at submit. Without --reply or --model: the examples only. docs/environments.md.",
    )
    trying.add_argument("package", metavar="WHEEL_OR_DIR", help="a wheel, or the package's project folder (built into a wheel first)")
    trying.add_argument("--args", metavar="JSON_OR_TOML", help="the [[env]] args: '{\"max_length\": 5}' or '{max_length = 5}'")
    trying.add_argument("--n", type=_positive_int, default=3, help="examples to show (default 3)")
    trying.add_argument("--split", choices=("train", "eval", "val"), default="train", help="the examples' split (default train)")
    trying.add_argument("--seed", type=int, default=0, help="the job's seed (default 0)")
    replies = trying.add_mutually_exclusive_group()
    replies.add_argument(
        "--reply", metavar="TEXT", action="append",
        help="score TEXT as every example's reply; multi-turn: repeat it, one per turn (the last answers every later turn)",
    )
    replies.add_argument("--model", metavar="ID", help="sample the replies with a catalogue model on this machine (needs torch)")
    trying.add_argument("--max-tokens", type=_positive_int, default=64, help="tokens per sampled reply (--model; default 64)")
    trying.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (--model; default 1.0)")
    trying.add_argument("--max-turns", type=_positive_int, default=8, help="turns of a multi-turn episode (default 8)")
    trying.add_argument(
        "--python", metavar="PYTHON",
        help="a verifiers package's interpreter: one with its requirements, needed for a load_environment package "
             "(a v1 taskset defaults to Lab's .venv-verifiers)",
    )
    trying.add_argument("-e", "--env", metavar="KEY=VALUE", action="append", help="give the environment this variable (repeat "
                        "it), such as a secret its load_environment reads with vf.ensure_keys; nothing else of this shell reaches it")
    trying.set_defaults(handler=envs_try)

    _add_evals(commands, json_flag)

    add_sandboxes_parser(commands, json_flag)

    deploy_command = commands.add_parser(
        "deploy", parents=[json_flag], help="serve a checkpoint, adapter or model behind the OpenAI-compatible API; prints its id",
        epilog="Then: openai.OpenAI(base_url=<base_url>, api_key=<an inference or write key>) with model=<its name> (docs/serving.md).",
    )
    deploy_command.add_argument("source", help="a checkpoint (ckpt_...), an adapter (adp_...) or a catalogue model id")
    deploy_command.add_argument("--name", help="the model name clients send (default <base model>:<id>, or the model id)")
    deploy_command.add_argument("--type", choices=["checkpoint", "adapter", "model"], help="what SOURCE is (default: from its prefix)")
    deploy_command.add_argument("--wait", action="store_true", help="wait until it is ready (exit 1 if it fails)")
    deploy_command.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits (default 600)")
    deploy_command.set_defaults(handler=deploy)

    deployments = commands.add_parser("deployments", parents=[json_flag], help="list, inspect and delete deployments")
    deployments.set_defaults(handler=deployments_list, status=None)
    deployment_commands = deployments.add_subparsers(dest="deployment_command", metavar="COMMAND")
    listing = deployment_commands.add_parser("list", parents=[json_flag], help="the project's deployments, newest first")
    listing.add_argument("--status", help="only those in this status (pending, deploying, ready, unloading, stopped, failed)")
    listing.set_defaults(handler=deployments_list)
    for name, help_text, handler in (("get", "show one deployment", deployments_get),
                                     ("delete", "take a deployment off its server", deployments_delete)):
        command = deployment_commands.add_parser(name, parents=[json_flag], help=help_text)
        command.add_argument("id", help="deployment id (dep_...)")
        command.set_defaults(handler=handler)

    webhooks = commands.add_parser(
        "webhooks", parents=[json_flag], help="create, list, test and delete webhook endpoints",
        epilog="Without a command: list. Lab refuses loopback and private URLs unless it runs with "
               "LAB_WEBHOOK_ALLOW_PRIVATE=1 (local development; docs/webhooks.md).",
    )
    webhooks.set_defaults(handler=webhooks_list)
    webhook_commands = webhooks.add_subparsers(dest="webhook_command", metavar="COMMAND")
    webhook_commands.add_parser("list", parents=[json_flag], help="the project's endpoints").set_defaults(
        handler=webhooks_list)
    create = webhook_commands.add_parser(
        "create", parents=[json_flag], help="add an endpoint; prints its secret, shown this once",
    )
    create.add_argument("url", help="where Lab sends events (http or https)")
    create.add_argument("--event", action="append", metavar="TYPE",
                        help="an event type to send (job.succeeded, checkpoint.ready, ...); repeatable; "
                             "default every type")
    create.set_defaults(handler=webhooks_create)
    for name, handler, help_text in (
        ("test", webhooks_test, "send the endpoint a webhook.test event"),
        ("rotate-secret", webhooks_rotate_secret, "give the endpoint a new secret (the old one signs 24 h more)"),
        ("delete", webhooks_delete, "delete an endpoint"),
    ):
        command = webhook_commands.add_parser(name, parents=[json_flag], help=help_text)
        command.add_argument("id", help="endpoint id (whep_...)")
        command.set_defaults(handler=handler)
    deliveries = webhook_commands.add_parser(
        "deliveries", parents=[json_flag], help="an endpoint's deliveries, newest first, with their tries",
    )
    deliveries.add_argument("id", help="endpoint id (whep_...)")
    deliveries.add_argument("--status", choices=("pending", "succeeded", "failed"), help="only these")
    deliveries.add_argument("--limit", type=_positive_int, default=20, help="most deliveries shown (default 20)")
    deliveries.set_defaults(handler=webhooks_deliveries)
    return parser


def _add_evals(commands, json_flag: argparse.ArgumentParser) -> None:
    """``lab evals run|list|get|samples|push|cancel|retry|delete`` (docs/evaluations.md)."""
    evals = commands.add_parser(
        "evals", parents=[json_flag],
        help="evaluate a model, checkpoint, adapter, deployment or endpoint on environments; read results and samples",
        epilog="Without a command: list. Results per environment: reward mean and standard error, each reward "
               "function's mean, pass@k, errors and timeouts (docs/evaluations.md).",
    )
    evals.set_defaults(handler=evals_list, status=None, limit=20)
    eval_commands = evals.add_subparsers(dest="eval_command", metavar="COMMAND")
    run = eval_commands.add_parser("run", parents=[json_flag], help="queue an evaluation; prints its id")
    target = run.add_mutually_exclusive_group()
    target.add_argument("--model", help="a catalogue model id")
    target.add_argument("--checkpoint", help="a ready checkpoint of this project (ckpt_...)")
    target.add_argument("--adapter", help="a ready adapter of this project (adp_...)")
    target.add_argument("--deployment", help="a deployment of this project (dep_...), through Lab's OpenAI-compatible API")
    target.add_argument("--endpoint", metavar="URL", help="an OpenAI-compatible endpoint's base URL (https://host/v1)")
    run.add_argument("--endpoint-model", metavar="MODEL", help="the model id the --endpoint serves")
    run.add_argument("--api-key-secret", metavar="NAME", help="--endpoint, --deployment: the --secret holding the API key")
    run.add_argument("--secret", action="append", metavar="NAME[=VALUE]",
                     help="a job secret for the evaluation (repeatable; NAME alone takes $NAME of this shell)")
    _add_evaluation_options(run)
    run.set_defaults(handler=evals_run)
    listing = eval_commands.add_parser("list", parents=[json_flag], help="the project's evaluations, newest first")
    listing.add_argument("--status", help="only evaluations in this status (queued, running, succeeded, ...)")
    listing.add_argument("--limit", type=_positive_int, default=20, help="most evaluations shown (default 20)")
    listing.set_defaults(handler=evals_list)
    for name, handler, help_text in (
        ("get", evals_get, "show one evaluation and its results"),
        ("cancel", evals_cancel, "cancel an evaluation"),
        ("retry", evals_retry, "run a failed or cancelled evaluation again"),
        ("delete", evals_delete, "delete a finished evaluation and its samples"),
    ):
        command = eval_commands.add_parser(name, parents=[json_flag], help=help_text)
        command.add_argument("id", help="evaluation id (eval_...)")
        command.set_defaults(handler=handler)
    push = eval_commands.add_parser(
        "push", parents=[json_flag], help="push the results of a local vf-eval run (verifiers 0.3 or 0.4) as an evaluation",
        epilog="DIR is a vf-eval run folder: metadata.json and results.jsonl (verifiers 0.3), or traces.jsonl and "
               "configs/resolved/eval.json (verifiers 0.4). Pushing the same run again stores nothing twice.",
    )
    push.add_argument("dir", help="the run's folder")
    push.add_argument("--name", help="the evaluation's name (default: ENV on MODEL)")
    push.add_argument("--env", help="the environment's id on Lab, instead of the one the run names")
    push.set_defaults(handler=evals_push)
    samples = eval_commands.add_parser("samples", parents=[json_flag], help="an evaluation's samples, in stored order")
    samples.add_argument("id", help="evaluation id (eval_...)")
    samples.add_argument("--env", help="only this environment's samples")
    samples.add_argument("--min-reward", type=float, help="only samples with at least this reward")
    samples.add_argument("--max-reward", type=float, help="only samples with at most this reward")
    samples.add_argument("--limit", type=_positive_int, default=20, help="most samples shown (default 20)")
    samples.set_defaults(handler=evals_samples)


def _add_evaluation_options(run: argparse.ArgumentParser) -> None:
    """What ``lab evals run`` and ``lab checkpoints eval`` take besides the model: environments,
    examples, rollouts, sampling, a name, a body file and waiting."""
    run.add_argument("--env", action="append", metavar="ID", help="an environment (repeatable)")
    run.add_argument("--env-args", action="append", metavar="ID=ARGS", help="an environment's args, as JSON or TOML (repeatable; ID as its --env gives it, with or without @version)")
    run.add_argument("--num-examples", type=examples_count, default=32, metavar="N|all", help="examples per environment (default 32; all: its whole eval split)")
    run.add_argument("--rollouts", type=_positive_int, default=1, help="rollouts per example (default 1; pass@k up to it)")
    run.add_argument("--temperature", type=float, help="sampling temperature (default 1.0; 0 is greedy)")
    run.add_argument("--top-p", type=float, help="nucleus sampling (default 1.0)")
    run.add_argument("--max-tokens", type=_positive_int, help="tokens per completion (default 128)")
    run.add_argument("--seed", type=int, help="the seed of prompts and sampling (default 0)")
    run.add_argument("--name", help="a name for people")
    run.add_argument("-f", "--file", help="the body as TOML (or JSON with a .json suffix); flags override its keys")
    _add_wait_options(run, "then wait for it to end and print its results (exit 1 unless it succeeds)")
