// onnxruntime side of make bench-infer: forwards of a random batch through MODEL.onnx
// (input "input" NCHW float, dynamic batch), timed after one warm-up run.
//   node infer_ort.js MODEL.onnx BATCH STEPS THREADS [SIZE]   (SIZE x SIZE images, default 224)
// Prints "img/s=<x> ms=<per batch> ort=<version>". NODE_PATH must reach onnxruntime-node.
const ort = require("onnxruntime-node");

async function main() {
    const [model, batch, steps, threads] = [process.argv[2], ...process.argv.slice(3, 6).map(Number)];
    const size = process.argv[6] ? Number(process.argv[6]) : 224;
    const s = await ort.InferenceSession.create(model, {
        intraOpNumThreads: threads, interOpNumThreads: 1, executionMode: "sequential",
        graphOptimizationLevel: "all",
    });
    const n = batch * 3 * size * size, data = new Float32Array(n);
    let seed = 1;
    for (let i = 0; i < n; i++) {
        seed = (seed * 1103515245 + 12345) & 0x7fffffff;
        data[i] = seed / 0x7fffffff * 2 - 1;
    }
    const feeds = { input: new ort.Tensor("float32", data, [batch, 3, size, size]) };
    await s.run(feeds);
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < steps; i++) await s.run(feeds);
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    const version = require("onnxruntime-node/package.json").version;
    console.log(`img/s=${(steps * batch / dt).toFixed(2)} ms=${(1000 * dt / steps).toFixed(2)} ort=${version}`);
}
main().catch((e) => { console.error(`infer_ort.js: ${e.message}`); process.exit(1); });
