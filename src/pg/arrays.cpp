// Batch columns as PostgreSQL arrays (see pg/arrays.hpp).
#include "pg/arrays.hpp"

extern "C" {
#include "utils/array.h"
#include "utils/lsyscache.h"
}

namespace eventbox::pg {

ArrayColumn::ArrayColumn(int n, Oid element_type)
    : n_(n),
      type_(element_type),
      values_(static_cast<Datum*>(palloc0(sizeof(Datum) * Max(n, 1)))),
      nulls_(static_cast<bool*>(palloc(sizeof(bool) * Max(n, 1)))) {
    for (int i = 0; i < n; ++i) nulls_[i] = true;
}

Datum ArrayColumn::get(int count) const {
    int16 typlen;
    bool typbyval;
    char typalign;
    get_typlenbyvalalign(type_, &typlen, &typbyval, &typalign);
    int dims[1] = {count < 0 || count > n_ ? n_ : count};
    int lbs[1] = {1};
    return PointerGetDatum(
        construct_md_array(values_, nulls_, 1, dims, lbs, type_, typlen, typbyval, typalign));
}

}  // namespace eventbox::pg
