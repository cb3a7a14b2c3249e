#include "workers/database_list.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.hpp"

using eventbox::worker::parse_database_list;

TEST(DatabaseList, OneNameIsTheOldSetting) {
    EXPECT_EQ(parse_database_list("app"), std::vector<std::string>{"app"});
}

TEST(DatabaseList, CommasSeparateAndBlanksAroundAreIgnored) {
    EXPECT_EQ(parse_database_list(" app ,billing,\tshop "),
              (std::vector<std::string>{"app", "billing", "shop"}));
    EXPECT_EQ(parse_database_list("my db"), std::vector<std::string>{"my db"});
}

TEST(DatabaseList, RejectsEmptyDuplicateLongAndTooMany) {
    EXPECT_THROW(parse_database_list(""), eventbox::Error);
    EXPECT_THROW(parse_database_list("app,"), eventbox::Error);
    EXPECT_THROW(parse_database_list("app,,b"), eventbox::Error);
    EXPECT_THROW(parse_database_list("app, app"), eventbox::Error);
    EXPECT_THROW(parse_database_list(std::string(64, 'x')), eventbox::Error);
    EXPECT_NO_THROW(parse_database_list(std::string(63, 'x')));
    EXPECT_NO_THROW(parse_database_list("a,b,c,d,e,f,g,h"));
    try {
        parse_database_list("a,b,c,d,e,f,g,h,i");
        FAIL();
    } catch (const eventbox::Error& e) {
        EXPECT_STREQ(e.sqlstate(), "54000");
    }
}
