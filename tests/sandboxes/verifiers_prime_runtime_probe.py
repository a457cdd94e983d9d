"""Run verifiers 0.4.0's own v1 ``prime`` runtime (``verifiers.v1.runtimes.PrimeRuntime``) against
Lab with the environment's Prime variables, as a rollout would: start, commands, files written
and read (relative to its work dir and absolute), a live process, teardown. Run with .venv-verifiers' Python; prints one JSON object per
``[PrimeConfig fields, [call names]]`` given (a JSON list) with what each call gave or raised."""

import asyncio
import json
import sys
import time

from verifiers.v1.runtimes import PrimeConfig, make_runtime


async def probe(fields: dict, names: list[str]) -> dict:
    runtime = make_runtime(PrimeConfig(**fields), name="probe")
    seen: dict = {}
    try:
        await runtime.start()
        seen["id"] = runtime.info.id
        calls = {
            "run": lambda: runtime.run(["python3", "-c", "import os; print(6 * 7, os.getcwd())"], {}),
            "write": lambda: runtime.write("answer.txt", b"42\n"),
            "read": lambda: runtime._read("answer.txt"),
            "run_on_written": lambda: runtime.run(["sh", "-c", "cat answer.txt /etc/probe/note; id -u"], {}),
            "write_absolute": lambda: runtime.write("/etc/probe/note", b"in etc\n"),
            "read_absolute": lambda: runtime._read("/etc/probe/note"),
            "live_process": lambda: runtime.open_process(["cat"], {}),
        }
        for name in names:
            started = time.monotonic()
            try:
                call = calls[name]
                result = await call()
                seen[name] = [result.exit_code, result.stdout, result.stderr] if name.startswith("run") else repr(result)[:200]
            except Exception as error:  # noqa: BLE001 - what failed is the finding
                seen[name + "_error"] = str(error)[:500]
            print(f"{name}: {time.monotonic() - started:.1f} s", file=sys.stderr)
    except Exception as error:  # noqa: BLE001
        seen["start_error"] = str(error)[:500]
    finally:
        await runtime.stop()
    return seen


for fields, names in json.loads(sys.argv[1]):
    print(json.dumps(asyncio.run(probe(fields, names))), flush=True)
