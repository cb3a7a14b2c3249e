// One column of a batch, built as a PostgreSQL array parameter for an unnest() statement.
// Trivially destructible (palloc'd storage): safe on frames an ERROR can longjmp across.
#pragma once

extern "C" {
#include "postgres.h"
}

namespace eventbox::pg {

class ArrayColumn {
  public:
    // `n` elements of type `element_type`, all NULL until set.
    ArrayColumn(int n, Oid element_type);
    void set(int i, Datum value) {
        values_[i] = value;
        nulls_[i] = false;
    }
    Datum value(int i) const { return values_[i]; }
    bool null(int i) const { return nulls_[i]; }
    // The array as a Datum (palloc'd in the current memory context): its first `count`
    // elements, all of them when count is negative.
    Datum get(int count = -1) const;
    // The array of elements rows[0..count) only, in that order (palloc'd likewise).
    Datum get_rows(const int* rows, int count) const;

  private:
    int n_;
    Oid type_;
    Datum* values_;
    bool* nulls_;
};

}  // namespace eventbox::pg
