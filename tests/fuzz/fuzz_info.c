/* A dataset's "__info__" record (rn.DatasetInfo bytes) through rn_dataset_info_parse. */
#include "fuzz.h"
#include "rn/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    rn_dataset_info info;
    if (rn_dataset_info_parse(data, size, "fuzz.lmdb", &info) == 0) rn_dataset_info_clear(&info);
    return 0;
}
