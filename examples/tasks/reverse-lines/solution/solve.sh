#!/bin/sh
# Wrong on purpose (see task.yaml): sorting is not reversing.
printf '#!/bin/sh\nsort -r "$1"\n' > reverse.sh
