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

Datum ArrayColumn::get_rows(const int* rows, int count) const {
    int16 typlen;
    bool typbyval;
    char typalign;
    get_typlenbyvalalign(type_, &typlen, &typbyval, &typalign);
    Datum* values = static_cast<Datum*>(palloc(sizeof(Datum) * Max(count, 1)));
    bool* nulls = static_cast<bool*>(palloc(sizeof(bool) * Max(count, 1)));
    for (int i = 0; i < count; ++i) {
        values[i] = values_[rows[i]];
        nulls[i] = nulls_[rows[i]];
    }
    int dims[1] = {count};
    int lbs[1] = {1};
    Datum a = PointerGetDatum(
        construct_md_array(values, nulls, 1, dims, lbs, type_, typlen, typbyval, typalign));
    pfree(values);
    pfree(nulls);
    return a;
}

}  // namespace eventbox::pg
