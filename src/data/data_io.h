/* The data readers' count of the bytes they read from data files
 * (dt_data_bytes_read, data.h): each adds what it read, as stored. */
#ifndef DT_DATA_IO_H
#define DT_DATA_IO_H

#include <stdint.h>

void dt_data_read_count(uint64_t n);

#endif
