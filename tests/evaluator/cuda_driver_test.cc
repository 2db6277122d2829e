// What the driver wrapper decides without a GPU: which PCI bus ids name one
// GPU (an evaluator compares its GPU's with the resident reference's).
#include <gtest/gtest.h>

#include "evaluator/cuda_driver.h"

TEST(SameBusId, TheSameGpuWhateverTheCaseOfItsHexDigits) {
  EXPECT_TRUE(ks::SameBusId("0000:1B:00.0", "0000:1b:00.0"));
  EXPECT_TRUE(ks::SameBusId("00000000:DB:00.0", "00000000:DB:00.0"));
}

TEST(SameBusId, AnotherBusDeviceOrDomainIsAnotherGpu) {
  EXPECT_FALSE(ks::SameBusId("0000:1B:00.0", "0000:1C:00.0"));
  EXPECT_FALSE(ks::SameBusId("0000:1B:00.0", "0001:1B:00.0"));
  EXPECT_FALSE(ks::SameBusId("0000:1B:00.0", "0000:1B:00"));
  EXPECT_FALSE(ks::SameBusId("", "0000:1B:00.0"));
}
