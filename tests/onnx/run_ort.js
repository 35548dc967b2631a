// Run an ONNX model with onnxruntime's Node.js binding on one batch read from a file.
// usage: node run_ort.js ORT_DIR MODEL.onnx IN.bin float32|uint8 D0,D1,... OUT.bin
// IN.bin holds the input tensor "input" (raw little-endian, row-major, of that type
// and shape); OUT.bin gets the output "logits" as raw float32. ORT_DIR is the folder
// npm installed onnxruntime-node into (make onnxruntime: build/node).
'use strict';
const fs = require('fs');
const path = require('path');

async function main() {
    const [ortDir, model, inFile, dtype, shapeText, outFile] = process.argv.slice(2);
    if (!outFile) {
        console.error('usage: node run_ort.js ORT_DIR MODEL.onnx IN.bin float32|uint8 D0,D1,... OUT.bin');
        process.exit(2);
    }
    const ort = require(path.resolve(ortDir, 'node_modules', 'onnxruntime-node'));
    const shape = shapeText.split(',').map(Number);
    const buf = fs.readFileSync(inFile);
    const bytes = new Uint8Array(buf.buffer, buf.byteOffset, buf.length).slice();
    const data = dtype === 'uint8' ? bytes : new Float32Array(bytes.buffer);
    const session = await ort.InferenceSession.create(model);
    const out = await session.run({input: new ort.Tensor(dtype, data, shape)});
    const logits = out.logits;
    fs.writeFileSync(outFile, Buffer.from(logits.data.buffer, logits.data.byteOffset, logits.data.byteLength));
    console.log(`${session.inputNames} -> ${session.outputNames}: logits ${logits.dims.join('x')}`);
}

main().catch((e) => {
    console.error(`run_ort.js: ${e.message || e}`);
    process.exit(1);
});
