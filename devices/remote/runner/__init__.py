"""edgemask remote runner: load one model, check it against sample_io.npz, time it, print one JSON document.

A package of rooms, shipped to a board as ONE file: ``devices.runner_app`` builds a zipapp of it on the host
(deterministically: the same sources give the same bytes), deployed like any other file under its sha256 and run
with the device's own Python. So every room stays self-contained: standard library at the top, numpy and the one
runtime it uses (onnxruntime, ExecuTorch's runtime or a TFLite interpreter) imported where used; rooms import each
other relatively and nothing else of ours; valid on Python 3.6 (Jetson TX2, JetPack 4.6), which vermin checks.

    python3 runner.pyz --model FILE --format onnx|pte|tflite|trt --sample-io FILE [settings] [--power-sensor NAME]
    python3 runner.pyz --model FILE --format pte-train|torch-train --train-io FILE --round-steps S [--train-rounds R]
    python3 runner.pyz --probe
    python3 runner.pyz --strays [--lock FILE --token T]   # kill runners of this workdir left by an earlier session
    python3 runner.pyz --hold-lock FILE --holder JSON --watch-stdin   # hold the board for one campaign
    python3 runner.pyz --set-governors '{"*": "performance"}'   # or {"cpu0": "ondemand", ...} to restore
    python3 runner.pyz --jetson-clocks store|apply|restore --state-file FILE

(``python -m edgemask.devices.remote.runner ...`` runs the same on the host.)

With ``--watch-stdin`` the runner exits as soon as its stdin reaches end-of-file or its parent process changes:
the host keeps stdin open for as long as it waits, so a runner whose session is gone (a timeout that closed the
SSH channel, a host killed) never goes on timing beside the next job.

Output on stdout is exactly one JSON object: {"ok": true, ...fields of devices.records.Measurement...} or
{"ok": false, "error": "one-line reason"}. Anything a runtime prints is sent to stderr instead.

The rooms (each imports only the ones listed before it; tests/test_architecture.py checks it):

    system        the board's /sys and /proc files, tools, where this runner lives
    errors        RunFailed, ProfilerMissing
    reference     sample_io.npz read, a job's outputs checked against the host's (train_io.npz: a step's)
    options       the measurement settings and their defaults (the host's RunnerSettings derives from it)
    sensors       power sensors (registry SENSORS) and the background PowerSampler
    parsers       tegrastats, get_throttled, nvpmodel, meminfo
    state         the device's state and this process's memory
    lock          the board lock (flock)
    session       the watchdog (dying with the session) and stray runners
    clocks        CPU governors and jetson_clocks
    profilers     per-operator profiles read (onnxruntime trace, ExecuTorch ETDump)
    trt_files     trtexec's files and output parsed
    trt           trtexec run, the engine cache, the TensorRT runtime entry
    training      the training runtimes (a client's local step), registry TRAINING_RUNTIMES
    runtimes      the runtime registry RUNTIMES (format -> class)
    trt_benchmark a "trt" job
    train_benchmark a "pte-train" or "torch-train" job (a local training step, checked against train_io.npz)
    benchmark     a job (timed runs, then profiled runs)
    probe         --probe
    cli           the command line

The host imports rooms too (devices.sensors for the sensors and pure parsers); nothing runs on import.
"""
