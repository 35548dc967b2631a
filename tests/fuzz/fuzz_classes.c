/* A class list (rn-prep --classes, DATA.lmdb/classes.txt) through rn_dataset_read_classes. */
#include <stdlib.h>

#include "fuzz.h"
#include "rn/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_file(data, size);
    char **names = NULL;
    int n = 0;
    if (!path || rn_dataset_read_classes(path, &names, &n) != 0) return 0;
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    return 0;
}
