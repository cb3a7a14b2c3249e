// partition_owner(): how the ingest workers deal out a subscription's partitions.
#include "kafka/consumer.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>

using eventbox::kafka::partition_owner;

TEST(PartitionOwner, OneWorkerOwnsEverything) {
    for (int p = 0; p < 64; ++p) {
        EXPECT_EQ(partition_owner("orders", p, 1), 0);
        EXPECT_EQ(partition_owner("orders", p, 0), 0);  // treated as one worker
    }
}

TEST(PartitionOwner, ATopicsPartitionsAreDealtOutEvenly) {
    for (const char* topic : {"orders", "payments", "a", "", "bench_in_200b_1"}) {
        for (int members = 2; members <= 8; ++members) {
            for (int partitions : {1, 7, 8, 32, 100}) {
                std::map<int, int> share;
                for (int p = 0; p < partitions; ++p) {
                    int owner = partition_owner(topic, p, members);
                    ASSERT_GE(owner, 0);
                    ASSERT_LT(owner, members);
                    ++share[owner];
                }
                int least = partitions, most = 0;
                for (int m = 0; m < members; ++m) {
                    least = std::min(least, share[m]);
                    most = std::max(most, share[m]);
                }
                EXPECT_LE(most - least, 1) << topic << " " << members << " " << partitions;
            }
        }
    }
}

TEST(PartitionOwner, SinglePartitionTopicsSpreadOverWorkers) {
    // Many one-partition topics must not all land on the first worker.
    std::map<int, int> share;
    for (int t = 0; t < 200; ++t) ++share[partition_owner("topic-" + std::to_string(t), 0, 2)];
    EXPECT_GT(share[0], 50);
    EXPECT_GT(share[1], 50);
}

TEST(PartitionOwner, IsStableAcrossProcesses) {
    // A fixed function of the bytes (FNV-1a), not std::hash: every worker, and the same worker
    // after a restart, must agree on the owner.
    EXPECT_EQ(partition_owner("orders", 0, 2), partition_owner(std::string("orders"), 0, 2));
    EXPECT_EQ(partition_owner("orders", 0, 7), 3);
    EXPECT_EQ(partition_owner("orders", 5, 7), 1);
}
