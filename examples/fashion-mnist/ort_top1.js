// Top-1 of an ONNX model with a uint8 NHWC input (rn-export --preprocess) through
// onnxruntime's Node.js binding, over a stream of images in batches.
// usage: node ort_top1.js ORT_DIR MODEL.onnx PIXELS.u8 LABELS.txt S [BATCH]
// PIXELS.u8: the images' u8 RGB pixels, S x S each, one after the other (rn-load --eval
// --raw of the whole set: exactly what rn-eval sees); LABELS.txt: one label per line, in
// the same order. Prints: top1=F correct=K n=N. ORT_DIR: where npm installed
// onnxruntime-node (make onnxruntime: build/node).
'use strict';
const fs = require('fs');
const path = require('path');

async function main() {
    const [ortDir, model, pixFile, labelFile, sText, batchText] = process.argv.slice(2);
    if (!sText) {
        console.error('usage: node ort_top1.js ORT_DIR MODEL.onnx PIXELS.u8 LABELS.txt S [BATCH]');
        process.exit(2);
    }
    const ort = require(path.resolve(ortDir, 'node_modules', 'onnxruntime-node'));
    const s = Number(sText), batch = Number(batchText || 256), img = s * s * 3;
    const pix = fs.readFileSync(pixFile);
    const labels = fs.readFileSync(labelFile, 'utf8').split('\n').filter((l) => l !== '').map(Number);
    if (pix.length !== labels.length * img)
        throw new Error(`${pixFile}: ${pix.length} bytes, want ${labels.length} images of ${s}x${s}x3`);
    const session = await ort.InferenceSession.create(model);
    let correct = 0;
    for (let i = 0; i < labels.length; i += batch) {
        const n = Math.min(batch, labels.length - i);
        const data = new Uint8Array(pix.buffer, pix.byteOffset + i * img, n * img);
        const out = await session.run({input: new ort.Tensor('uint8', data, [n, s, s, 3])});
        const logits = out.logits.data, k = out.logits.dims[1];
        for (let j = 0; j < n; j++) {
            // argmax, the first of equal maxima (as rn-eval's top-1)
            let best = 0;
            for (let c = 1; c < k; c++)
                if (logits[j * k + c] > logits[j * k + best]) best = c;
            if (best === labels[i + j]) correct++;
        }
    }
    console.log(`top1=${(correct / labels.length).toFixed(4)} correct=${correct} n=${labels.length}`);
}

main().catch((e) => {
    console.error(`ort_top1.js: ${e.message || e}`);
    process.exit(1);
});
