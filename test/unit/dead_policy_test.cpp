// Non-retryable errors: which handler errors send a message to dead at its first attempt.
#include <gtest/gtest.h>

#include "handlers/dead_policy.hpp"

using namespace eventbox::handlers;

TEST(DeadPolicy, SqlstateIsReadFromTheErrorText) {
    EXPECT_EQ(error_sqlstate("22P02: invalid input syntax for type integer: \"x\""), "22P02");
    EXPECT_EQ(error_sqlstate("57014: handler cancelled after eventbox.handler_timeout"), "57014");
    EXPECT_EQ(error_sqlstate("attempt 3 never finished: the backend crashed"), "");
    EXPECT_EQ(error_sqlstate("22p02: lower case is no SQLSTATE"), "");
    EXPECT_EQ(error_sqlstate("22P02"), "");
    EXPECT_EQ(error_sqlstate(""), "");
}

TEST(DeadPolicy, CodesAndClassesMatch) {
    EXPECT_TRUE(sqlstate_listed("22P02", "22,23502,23514"));
    EXPECT_TRUE(sqlstate_listed("22012", "22,23502,23514"));
    EXPECT_TRUE(sqlstate_listed("23514", "22,23502,23514"));
    EXPECT_FALSE(sqlstate_listed("23505", "22,23502,23514"));  // unique violation: retried
    EXPECT_FALSE(sqlstate_listed("40001", "22,23502,23514"));  // serialization failure
    EXPECT_FALSE(sqlstate_listed("22P02", ""));
    EXPECT_TRUE(sqlstate_listed("40P01", "40"));
    EXPECT_FALSE(sqlstate_listed("2", "2"));
    EXPECT_FALSE(sqlstate_listed("22P0", "22P0"));
}

TEST(DeadPolicy, RefusalIsNeverRetried) {
    EXPECT_TRUE(not_retryable("QE001: order 42 refused by the handler", ""));
    EXPECT_TRUE(not_retryable("22P02: bad input", "22"));
    EXPECT_FALSE(not_retryable("22P02: bad input", ""));
    EXPECT_FALSE(not_retryable("P0001: a plain RAISE EXCEPTION", "22,23502,23514"));
    EXPECT_FALSE(not_retryable("attempt 2 never finished", "22"));
}
